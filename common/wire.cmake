# The wire part of common/: the Cap'n Proto schema (generated into the build tree as
# generated/common/messages.capnp.{h,c++}) and the ZeroMQ transport's libraries.
set(CAPNPC_SRC_PREFIX ${PROJECT_SOURCE_DIR})
set(CAPNPC_OUTPUT_DIR ${PROJECT_BINARY_DIR}/generated)
capnp_generate_cpp(downpour_capnp_srcs downpour_capnp_hdrs ${CMAKE_CURRENT_SOURCE_DIR}/messages.capnp)
target_sources(downpour_common PRIVATE ${downpour_capnp_srcs} ${downpour_capnp_hdrs})
# PRIVATE: only common/ sees Cap'n Proto and ZeroMQ headers (STYLE.md §4).
target_link_libraries(downpour_common PRIVATE CapnProto::capnp CapnProto::kj PkgConfig::ZMQ cppzmq)
