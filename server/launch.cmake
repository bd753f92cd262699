# downpour-launch: the single-machine launcher (a thin main over common/process_group.h).
add_executable(downpour-launch ${CMAKE_CURRENT_SOURCE_DIR}/launch_main.cc)
target_link_libraries(downpour-launch PRIVATE downpour_common CLI11::CLI11)
