# The shard server and coordinator (wire part of server/): library downpour_server and the thin
# mains downpour-server / downpour-coordinator.
add_library(downpour_server shard.cc consistency.cc coordinator.cc process_util.cc)
target_link_libraries(downpour_server PUBLIC downpour_common downpour_server_update
                      PRIVATE spdlog::spdlog)
add_executable(downpour-server server_main.cc)
target_link_libraries(downpour-server PRIVATE downpour_server CLI11::CLI11 spdlog::spdlog)
add_executable(downpour-coordinator coordinator_main.cc)
target_link_libraries(downpour-coordinator PRIVATE downpour_server CLI11::CLI11 spdlog::spdlog)
