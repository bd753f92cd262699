// zmq_transport.cc — see zmq_transport.h. The only file that includes ZeroMQ.
#include "common/zmq_transport.h"

#include <zmq.hpp>

namespace downpour {

struct ZmqTransport::Impl {
  ZmqOptions options;
  zmq::context_t context;
  explicit Impl(const ZmqOptions& o) : options(o), context(o.io_threads) {}
};

namespace {

Status ZmqError(const char* what, const std::string& address, const zmq::error_t& e) {
  return Unavailable("zmq {} '{}': {} (errno {})", what, address, e.what(), e.num());
}

// Called by ZeroMQ's I/O thread once it no longer reads a zero-copy frame's bytes.
void ReleaseKeepalive(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

zmq::message_t ToMessage(const Frame& f, size_t zero_copy_min) {
  // use_count, not operator bool: a keepalive may own a deleter with a null pointer (the ps
  // client's per-request completion signal); only a frame with no keepalive at all is copied.
  if (f.owner().use_count() > 0 && f.size() >= zero_copy_min) {
    auto* hint = new std::shared_ptr<const void>(f.owner());
    return zmq::message_t(const_cast<std::byte*>(f.data()), f.size(), &ReleaseKeepalive, hint);
  }
  return zmq::message_t(f.data(), f.size());
}

// Sends frames as one multipart message (the first `prefix` frame, if any, is the ROUTER
// identity). ZeroMQ delivers multipart messages atomically.
Status SendAll(zmq::socket_t& socket, const std::string* prefix, Frames& frames,
               size_t zero_copy_min, const std::string& address) {
  try {
    if (frames.empty()) return InvalidArgument("zmq send to '{}': a message needs a frame", address);
    if (prefix) {
      zmq::message_t id(prefix->data(), prefix->size());
      if (!socket.send(id, zmq::send_flags::sndmore)) {
        return Timeout("zmq send to '{}' timed out", address);
      }
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m = ToMessage(frames[i], zero_copy_min);
      const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (!socket.send(m, flags)) {
        return Timeout("zmq send to '{}' timed out", address);
      }
    }
  } catch (const zmq::error_t& e) {
    return ZmqError("send", address, e);
  }
  return Status::Ok();
}

// Receives one multipart message, waiting up to `timeout` for its first frame.
Status ReceiveAll(zmq::socket_t& socket, PeerId* identity, Frames* frames, std::chrono::milliseconds timeout,
                  const std::string& address, PeerInfo* info = nullptr) {
  try {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) {
      return Timeout("zmq '{}': no message within {} ms", address, timeout.count());
    }
    frames->clear();
    bool first = true;
    while (true) {
      auto msg = std::make_shared<zmq::message_t>();
      if (!socket.recv(*msg, zmq::recv_flags::dontwait)) {
        return Internal("zmq '{}': multipart message cut short", address);
      }
      const bool more = msg->more();
      if (first && info != nullptr) {
        // Connection metadata (ZMTP): the ZAP handler's user id and the peer's address.
        const char* user = zmq_msg_gets(msg->handle(), "User-Id");
        const char* peer = zmq_msg_gets(msg->handle(), "Peer-Address");
        info->user_id = user != nullptr ? user : "";
        info->address = peer != nullptr ? peer : "";
      }
      if (first && identity) {
        identity->assign(static_cast<const char*>(msg->data()), msg->size());
      } else {
        const void* data = msg->data();
        const size_t size = msg->size();
        frames->push_back(Frame::Borrow(data, size, std::move(msg)));
      }
      first = false;
      if (!more) break;
    }
  } catch (const zmq::error_t& e) {
    return ZmqError("receive", address, e);
  }
  return Status::Ok();
}

class ZmqServer : public ServerEndpoint {
 public:
  ZmqServer(ZmqTransport::Impl* impl, zmq::socket_t socket, std::string address)
      : impl_(impl), socket_(std::move(socket)), address_(std::move(address)) {}
  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    Status s = ReceiveAll(socket_, from, frames, timeout, address_, info);
    if (s.ok() && frames->empty()) {
      return Corrupt("zmq '{}': message without frames", address_);
    }
    return s;
  }
  Status Send(const PeerId& to, Frames frames) override {
    return SendAll(socket_, &to, frames, impl_->options.zero_copy_min_bytes, address_);
  }
  std::string address() const override { return address_; }

 private:
  ZmqTransport::Impl* impl_;
  zmq::socket_t socket_;
  std::string address_;
};

class ZmqClient : public ClientEndpoint {
 public:
  ZmqClient(ZmqTransport::Impl* impl, zmq::socket_t socket, std::string address)
      : impl_(impl), socket_(std::move(socket)), address_(std::move(address)) {}
  Status Send(Frames frames) override {
    return SendAll(socket_, nullptr, frames, impl_->options.zero_copy_min_bytes, address_);
  }
  Status Receive(Frames* frames, std::chrono::milliseconds timeout) override {
    return ReceiveAll(socket_, nullptr, frames, timeout, address_);
  }

 private:
  ZmqTransport::Impl* impl_;
  zmq::socket_t socket_;
  std::string address_;
};

void CommonOptions(zmq::socket_t& s, const ZmqOptions& o) {
  s.set(zmq::sockopt::linger, o.linger_ms);
  s.set(zmq::sockopt::sndtimeo, o.send_timeout_ms);
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
}

}  // namespace

ZmqTransport::ZmqTransport(ZmqOptions options) : impl_(std::make_unique<Impl>(options)) {}
ZmqTransport::~ZmqTransport() = default;

Status ZmqTransport::Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) {
  try {
    zmq::socket_t s(impl_->context, zmq::socket_type::router);
    CommonOptions(s, impl_->options);
    s.set(zmq::sockopt::router_mandatory, 1);  // replies to a vanished peer fail, not vanish
    s.bind(address);
    std::string bound = s.get(zmq::sockopt::last_endpoint);
    *out = std::make_unique<ZmqServer>(impl_.get(), std::move(s), std::move(bound));
  } catch (const zmq::error_t& e) {
    return ZmqError("bind", address, e);
  }
  return Status::Ok();
}

Status ZmqTransport::Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) {
  try {
    zmq::socket_t s(impl_->context, zmq::socket_type::dealer);
    CommonOptions(s, impl_->options);
    s.connect(address);
    *out = std::make_unique<ZmqClient>(impl_.get(), std::move(s), address);
  } catch (const zmq::error_t& e) {
    return ZmqError("connect", address, e);
  }
  return Status::Ok();
}

}  // namespace downpour
