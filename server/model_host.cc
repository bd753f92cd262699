#include "server/model_host.h"

#include <spdlog/spdlog.h>

#include "common/codec.h"

namespace downpour {

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

Status ModelHost::Serve(ServerEndpoint* ep) {
  for (const auto& s : shards_) DP_RETURN_IF_ERROR(s->OpenLog());
  const auto poll = shards_[0]->options().poll_interval;
  Status result;
  while (!stop_.load() && !shutdown_requested()) {
    PeerId peer;
    PeerInfo info;
    Frames frames;
    const Status s = ep->Receive(&peer, &frames, poll, &info);
    if (s.ok()) {
      MessageHeader h;
      if (!ParseHeader(frames, &h).ok()) {
        shards_[0]->Handle(ep, peer, info, frames);  // refused and counted as undecodable there
      } else if (h.model_id >= shards_.size()) {
        RefuseUnknownModel(ep, peer, h);
      } else {
        shards_[h.model_id]->Handle(ep, peer, info, frames);
      }
    } else if (s.code() != StatusCode::kTimeout) {
      result = s;
      break;
    }
    for (const auto& shard : shards_) shard->Tick(ep);
  }
  for (const auto& shard : shards_) {
    const Status f = shard->Finish();
    if (result.ok() && !f.ok()) result = f;
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
