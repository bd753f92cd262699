// zmq_transport.h — Transport over ZeroMQ: a ROUTER per server endpoint, a DEALER per client
// endpoint, tcp (or ipc/inproc addresses ZeroMQ understands). Payload frames of at least
// kZeroCopyMinBytes are sent zero-copy (zmq_msg_init_data with the frame's bytes and a free
// function that releases the frame's keepalive); smaller frames are copied. Received frames
// keep their zmq message as owner (no copy).
//
// Thread-safety: see transport.h. The ZmqTransport owns the ZeroMQ context (no global one);
// it must outlive its endpoints.
#pragma once

#include <memory>

#include "common/transport.h"

namespace downpour {

struct ZmqOptions {
  int io_threads = 2;                       // ZeroMQ I/O threads of the context
  int send_timeout_ms = 30000;              // a send blocked this long (peer's queue full) fails
  int linger_ms = 500;                      // how long close waits for unsent messages
  int64_t max_message_bytes = int64_t{256} << 20;  // per received frame; larger = peer dropped
  size_t zero_copy_min_bytes = 4096;        // frames smaller than this are copied at send
};

class ZmqTransport : public Transport {
 public:
  explicit ZmqTransport(ZmqOptions options = {});
  ~ZmqTransport() override;
  Status Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) override;
  Status Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace downpour
