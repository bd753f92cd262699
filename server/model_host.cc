#include "server/model_host.h"

#include <spdlog/spdlog.h>

#include "common/codec.h"

namespace downpour {

ShardOptions RunShardOptions(const RunConfig& config, int server_id, int model) {
  ShardOptions o;
  o.server_id = server_id;
  o.model_id = static_cast<uint32_t>(model);
  o.solver = config.models.empty() ? RunSolver(config) : ModelSolver(config, model);
  o.consistency = config.consistency;
  o.cluster = config.cluster;
  o.compression = config.compression;
  o.worker = config.worker;
  o.checkpoint = config.checkpoint;
  o.model_moves = !config.models.empty();
  return o;
}

Status LoadRunLayouts(const RunConfig& config, const std::string& config_path, const std::string& tensors_file,
                      const std::string& model, const std::string& run_dir, std::vector<ParamLayout>* out) {
  std::vector<std::vector<TensorSpec>> specs;
  if (!config.models.empty()) {
    if (!tensors_file.empty() || !model.empty()) {
      return InvalidArgument("--tensors / --model: {} trains {} models ([[models]]); their tensor lists are "
                             "{}/tensors-model-<k>.txt (downpour-launch writes them)",
                             config_path, config.models.size(), run_dir);
    }
    DP_RETURN_IF_ERROR(LoadModelTensorLists(run_dir, static_cast<int>(config.models.size()), &specs));
  } else {
    specs.emplace_back();
    DP_RETURN_IF_ERROR(ResolveTensorList(tensors_file, model, &specs[0]));
  }
  out->assign(specs.size(), ParamLayout{});
  for (size_t k = 0; k < specs.size(); ++k) {
    DP_RETURN_IF_ERROR(
        ParamLayout::Build(specs[k], config.cluster.servers, config.cluster.chunk_elems, &(*out)[k]));
  }
  return Status::Ok();
}

Status ModelHost::Create(std::vector<std::unique_ptr<ShardServer>> shards, std::unique_ptr<ModelHost>* out) {
  if (shards.empty()) return InvalidArgument("model host: no models to serve");
  for (size_t k = 0; k < shards.size(); ++k) {
    if (!shards[k]) return InvalidArgument("model host: model {} has no shard", k);
    if (shards[k]->options().model_id != k) {
      return InvalidArgument("model host: shard {} serves model id {}, expected {}", k, shards[k]->options().model_id, k);
    }
    if (shards[k]->options().server_id != shards[0]->options().server_id) {
      return InvalidArgument("model host: shard {} is server {}, shard 0 is server {}", k,
                             shards[k]->options().server_id, shards[0]->options().server_id);
    }
  }
  out->reset(new ModelHost(std::move(shards)));
  return Status::Ok();
}

bool ModelHost::log_failed() const {
  for (const auto& s : shards_) {
    if (s->log_failed()) return true;
  }
  return false;
}

bool ModelHost::shutdown_requested() const {
  for (const auto& s : shards_) {
    if (s->shutdown_requested()) return true;
  }
  return false;
}

void ModelHost::RefuseUnknownModel(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h) {
  unknown_model_.fetch_add(1);
  const Status why = InvalidArgument("model id {} is not served here (server {} serves models 0..{})", h.model_id,
                                     shards_[0]->options().server_id, shards_.size() - 1);
  spdlog::debug("server {}: refused {}: {}", shards_[0]->options().server_id, MsgTypeName(h.type), why.message());
  MessageHeader reply = ErrorReply(h, why);
  reply.flags = static_cast<uint32_t>(RejectReason::kModelId);
  reply.sender = shards_[0]->options().server_id;
  reply.incarnation = shards_[0]->incarnation();
  Frames frames(1);
  if (HeaderFrame(reply, &frames[0]).ok()) (void)ep->Send(peer, std::move(frames));
}

void ModelHost::Dispatch(ServerEndpoint* ep, Inbound& m) {
  if (!m.parsed) {
    shards_[0]->Handle(ep, m.peer, m.info, m.frames);  // refused and counted as undecodable there
  } else if (m.h.model_id >= shards_.size()) {
    RefuseUnknownModel(ep, m.peer, m.h);
  } else {
    shards_[m.h.model_id]->Handle(ep, m.peer, m.info, m.frames);
  }
}

uint64_t ModelHost::StepKey(const Inbound& m, uint64_t arrival_ns) {
  const bool worker_message =
      m.parsed && (m.h.type == MsgType::kPush || m.h.type == MsgType::kPull || m.h.type == MsgType::kClock);
  // Anything else (registrations, heartbeats, stats, the evaluator's pulls, what cannot be
  // decoded) is small or rare, and a heartbeat must not wait behind a queue of pushes: first.
  if (!worker_message || m.h.role == Role::kEvaluator || m.h.sender < 0 ||
      static_cast<size_t>(m.h.sender) >= step_key_.size()) {
    return 0;
  }
  const int64_t step = m.h.type == MsgType::kPush ? m.h.clock : m.h.clock - 1;
  auto& [current, first] = step_key_[static_cast<size_t>(m.h.sender)];
  if (step != current) {
    current = step;
    first = arrival_ns;
  }
  return first;
}

size_t ModelHost::Next() const {
  size_t best = inbox_.size();
  for (size_t i = 0; i < inbox_.size(); ++i) {
    // Only a peer's oldest waiting message may go.
    bool older = false;
    for (size_t j = 0; j < i && !older; ++j) older = inbox_[j].peer == inbox_[i].peer;
    if (older) continue;
    if (best == inbox_.size() || inbox_[i].key < inbox_[best].key) best = i;  // ties: the older
  }
  return best;
}

Status ModelHost::Serve(ServerEndpoint* ep) {
  for (const auto& s : shards_) {
    s->SetWake([ep] { ep->Wake(); });  // a log that wrote more: its held acks are due
    DP_RETURN_IF_ERROR(s->OpenLog());
  }
  const auto poll = shards_[0]->options().poll_interval;
  const bool by_step = shards_[0]->options().cluster.reply_order == ReplyOrder::kStep;
  if (by_step) {
    const auto& o = shards_[0]->options();
    step_key_.assign(static_cast<size_t>(o.cluster.max_workers > 0 ? o.cluster.max_workers : o.cluster.workers),
                     {-1, 0});
  }
  Status result;
  size_t inbox_bytes = 0;
  while (!stop_.load() && !shutdown_requested() && !log_failed()) {
    // Take what is waiting: one message, or by step all there are (at most kInbox
    // messages, or until kInboxBytes is passed); wait only when nothing is left to handle.
    while (inbox_.size() < kInbox && inbox_bytes < kInboxBytes) {
      Inbound m;
      const Status s = ep->Receive(&m.peer, &m.frames, inbox_.empty() ? poll : std::chrono::milliseconds(0), &m.info);
      if (s.code() == StatusCode::kTimeout) break;
      if (!s.ok()) {
        result = s;
        break;
      }
      m.parsed = ParseHeader(m.frames, &m.h).ok();
      for (const Frame& f : m.frames) m.bytes += f.size();
      if (by_step) {
        m.key = StepKey(m, static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
      }
      inbox_bytes += m.bytes;
      inbox_.push_back(std::move(m));
      if (!by_step) break;
    }
    if (!result.ok()) break;
    if (!inbox_.empty()) {
      const size_t i = by_step ? Next() : 0;
      Inbound m = std::move(inbox_[i]);
      inbox_.erase(inbox_.begin() + static_cast<std::ptrdiff_t>(i));
      inbox_bytes -= m.bytes;
      Dispatch(ep, m);
    }
    for (const auto& shard : shards_) shard->Tick(ep);
  }
  inbox_.clear();
  for (const auto& shard : shards_) {  // a log failure is why the loop stopped: it is the answer
    if (result.ok()) result = shard->LogFailure();
  }
  for (const auto& shard : shards_) {
    const Status f = shard->Finish(ep);
    if (result.ok() && !f.ok()) result = f;
    shard->SetWake(nullptr);
  }
  return result;
}

void ModelHost::Start(std::unique_ptr<ServerEndpoint> endpoint) {
  owned_endpoint_ = std::move(endpoint);
  thread_ = std::thread([this] { thread_status_ = Serve(owned_endpoint_.get()); });
}

Status ModelHost::Join() {
  if (thread_.joinable()) thread_.join();
  return thread_status_;
}

void ModelHost::Stop() { stop_.store(true); }

}  // namespace downpour
