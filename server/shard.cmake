# The shard server (wire part of server/): library downpour_server.
add_library(downpour_server shard.cc consistency.cc)
target_link_libraries(downpour_server PUBLIC downpour_common downpour_server_update
                      PRIVATE spdlog::spdlog)
