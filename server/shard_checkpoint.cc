// shard_checkpoint.cc — see shard_checkpoint.h.
#include "server/shard_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <map>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace downpour {
namespace {

constexpr const char* kKind = "downpour-shard";

std::string Meta(const TensorFile& file, const std::string& key) {
  auto it = file.meta.find(key);
  return it == file.meta.end() ? std::string() : it->second;
}

// A whole decimal number in `text`, or false.
template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

// Meta `key` as a number; absent = `fallback` (a checkpoint older than the key).
template <typename T>
Status MetaNumber(const TensorFile& file, const std::string& path, const std::string& key, T fallback, T* out) {
  auto it = file.meta.find(key);
  if (it == file.meta.end()) {
    *out = fallback;
    return Status::Ok();
  }
  if (!ParseNumber(it->second, out)) return Corrupt("{}: meta '{}' is '{}', not a number", path, key, it->second);
  return Status::Ok();
}

// Meta `key` as a list of exactly `n` integers.
Status MetaList(const TensorFile& file, const std::string& path, const std::string& key, size_t n,
                std::vector<int64_t>* out) {
  DP_RETURN_IF_ERROR(ParseMetaInts(Meta(file, key), path, key, out));
  if (out->size() != n) {
    return Corrupt("{}: meta '{}' has {} entries, the shard has {} {}", path, key, out->size(), n,
                   key == "pushes_by_worker" ? "worker ids" : "chunks");
  }
  return Status::Ok();
}

// "session:id,id;session:id" → sessions (ids in order, repeats dropped).
Status ParseDedup(const std::string& text, const std::string& path, const std::string& key,
                  std::vector<ShardCheckpoint::Session>* out) {
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t semi = rest.find(';');
    const std::string_view one = rest.substr(0, semi);
    rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
    const size_t colon = one.find(':');
    ShardCheckpoint::Session s;
    if (colon == std::string_view::npos || !ParseNumber(one.substr(0, colon), &s.session)) {
      return Corrupt("{}: meta '{}': bad session entry '{}'", path, key, one);
    }
    std::string_view ids = one.substr(colon + 1);
    std::unordered_set<uint64_t> seen;
    while (!ids.empty()) {
      const size_t comma = ids.find(',');
      const std::string_view id = ids.substr(0, comma);
      ids = comma == std::string_view::npos ? std::string_view() : ids.substr(comma + 1);
      uint64_t v = 0;
      if (!ParseNumber(id, &v)) return Corrupt("{}: meta '{}': bad request id '{}'", path, key, id);
      if (seen.insert(v).second) s.ids.push_back(v);
    }
    out->push_back(std::move(s));
  }
  return Status::Ok();
}

}  // namespace

TensorFile EncodeShardCheckpoint(ShardCheckpoint&& c) {
  TensorFile file;
  file.meta["kind"] = kKind;
  file.meta["server_id"] = std::to_string(c.server_id);
  file.meta["server_count"] = std::to_string(c.server_count);
  file.meta["layout_hash"] = std::to_string(c.layout_hash);
  file.meta["model_id"] = std::to_string(c.model_id);
  file.meta["updates"] = std::to_string(c.updates);
  std::vector<int64_t> versions, iters, inited;
  for (const ShardCheckpoint::Chunk& ch : c.chunks) {
    versions.push_back(ch.version);
    iters.push_back(ch.iter);
    inited.push_back(ch.initialized ? 1 : 0);
  }
  file.meta["versions"] = FormatMetaInts(versions);
  file.meta["schedule_iters"] = FormatMetaInts(iters);
  file.meta["initialized"] = FormatMetaInts(inited);
  file.meta["wal_seq"] = std::to_string(c.wal_seq);
  file.meta["max_workers"] = std::to_string(c.max_workers);
  file.meta["update_rule"] = c.update_rule;
  file.meta["pushes_by_worker"] = FormatMetaInts(c.pushes_by_worker);
  // At most 4 sessions × 4096 ids × 21 bytes a worker, under the format's 1 MiB a value.
  for (size_t w = 0; w < c.dedup.size(); ++w) {
    if (c.dedup[w].empty()) continue;
    std::string text;
    for (const ShardCheckpoint::Session& s : c.dedup[w]) {
      if (!text.empty()) text += ';';
      text += fmt::format("{}:{}", s.session, fmt::join(s.ids, ","));
    }
    file.meta[fmt::format("dedup.{}", w)] = std::move(text);
  }
  for (ShardCheckpoint::Chunk& ch : c.chunks) {
    const auto n = static_cast<int64_t>(ch.weights.size());
    file.tensors.push_back(NamedTensor{fmt::format("chunk{}.weights", ch.id), {n}, std::move(ch.weights)});
    file.tensors.push_back(NamedTensor{fmt::format("chunk{}.history", ch.id), {n}, std::move(ch.history)});
    for (auto& [name, state] : ch.rule_state) {
      if (!state.empty())
        file.tensors.push_back(NamedTensor{fmt::format("chunk{}.{}", ch.id, name), {n}, std::move(state)});
    }
  }
  return file;
}

Status DecodeShardCheckpoint(TensorFile& file, const std::string& path, const ShardCheckpointExpect& expect,
                             ShardCheckpoint* out) {
  *out = ShardCheckpoint();
  if (Meta(file, "kind") != kKind) {
    return Corrupt("{}: not a shard checkpoint (meta kind = '{}')", path, Meta(file, "kind"));
  }
  if (Meta(file, "layout_hash") != std::to_string(expect.layout_hash) ||
      Meta(file, "server_id") != std::to_string(expect.server_id)) {
    return FailedPrecondition("{}: checkpoint of server {} with layout hash {}; this is server {} with layout hash {}",
                              path, Meta(file, "server_id"), Meta(file, "layout_hash"), expect.server_id,
                              expect.layout_hash);
  }
  if (Meta(file, "model_id") != std::to_string(expect.model_id)) {
    return FailedPrecondition("{}: checkpoint of model {}; this server serves model {}", path, Meta(file, "model_id"),
                              expect.model_id);
  }
  const std::string rule = file.meta.count("update_rule") != 0 ? Meta(file, "update_rule") : "momentum";
  if (rule != expect.update_rule) {
    return FailedPrecondition(
        "{}: checkpoint of a shard updated by solver.update = \"{}\"; this one runs \"{}\", whose state it does not "
        "hold",
        path, rule, expect.update_rule);
  }
  out->update_rule = rule;
  out->server_id = expect.server_id;
  out->layout_hash = expect.layout_hash;
  out->model_id = expect.model_id;
  DP_RETURN_IF_ERROR(MetaNumber(file, path, "server_count", int32_t{0}, &out->server_count));
  DP_RETURN_IF_ERROR(MetaNumber(file, path, "updates", int64_t{0}, &out->updates));
  DP_RETURN_IF_ERROR(MetaNumber(file, path, "wal_seq", uint64_t{0}, &out->wal_seq));
  if (out->updates < 0) return Corrupt("{}: meta 'updates' is {} (< 0)", path, out->updates);

  const size_t n = expect.chunk_ids.size();
  std::vector<int64_t> versions, iters, inited;
  DP_RETURN_IF_ERROR(MetaList(file, path, "versions", n, &versions));
  if (file.meta.count("schedule_iters") != 0) {
    DP_RETURN_IF_ERROR(MetaList(file, path, "schedule_iters", n, &iters));
  } else {
    iters = versions;  // before the schedule counted worker batches, its iteration was the version
  }
  DP_RETURN_IF_ERROR(MetaList(file, path, "initialized", n, &inited));
  for (size_t i = 0; i < n; ++i) {
    if (versions[i] < 0) return Corrupt("{}: meta 'versions': chunk {} has {} (< 0)", path, i, versions[i]);
    if (iters[i] < 0) return Corrupt("{}: meta 'schedule_iters': chunk {} has {} (< 0)", path, i, iters[i]);
  }

  // The state since the write-ahead log: every policy's SaveState writes policy.member_clocks.
  out->has_state = file.meta.count("policy.member_clocks") != 0;
  out->max_workers = expect.max_workers;
  out->dedup.resize(static_cast<size_t>(expect.max_workers));
  if (out->has_state) {
    if (Meta(file, "max_workers") != std::to_string(expect.max_workers)) {
      return FailedPrecondition(
          "{}: checkpoint of a server accounting for {} workers; this one accounts for {} (cluster.max_workers)", path,
          Meta(file, "max_workers"), expect.max_workers);
    }
    DP_RETURN_IF_ERROR(
        MetaList(file, path, "pushes_by_worker", static_cast<size_t>(expect.max_workers), &out->pushes_by_worker));
    for (size_t w = 0; w < out->pushes_by_worker.size(); ++w) {
      if (out->pushes_by_worker[w] < 0) {
        return Corrupt("{}: meta 'pushes_by_worker': worker {} has {} (< 0)", path, w, out->pushes_by_worker[w]);
      }
    }
  }
  for (size_t w = 0; w < out->dedup.size(); ++w) {
    const std::string key = fmt::format("dedup.{}", w);
    DP_RETURN_IF_ERROR(ParseDedup(Meta(file, key), path, key, &out->dedup[w]));
  }

  std::map<std::string, NamedTensor*> by_name;
  for (NamedTensor& t : file.tensors) by_name[t.name] = &t;
  auto find = [&](const std::string& name, size_t elems, bool required, NamedTensor** t) -> Status {
    auto it = by_name.find(name);
    *t = it == by_name.end() ? nullptr : it->second;
    if (*t == nullptr) return required ? Corrupt("{}: tensor '{}' is missing", path, name) : Status::Ok();
    if ((*t)->data.size() != elems) {
      return Corrupt("{}: tensor '{}' has {} floats, chunk needs {}", path, name, (*t)->data.size(), elems);
    }
    return Status::Ok();
  };
  // Every tensor is checked before any is moved out, so a failure leaves `file` whole.
  std::vector<NamedTensor*> weights(n), history(n);
  std::vector<std::vector<NamedTensor*>> rule_state(n, std::vector<NamedTensor*>(expect.rule_states.size()));
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = expect.chunk_ids[i];
    const size_t elems = expect.chunk_elems[i];
    DP_RETURN_IF_ERROR(find(fmt::format("chunk{}.weights", id), elems, true, &weights[i]));
    DP_RETURN_IF_ERROR(find(fmt::format("chunk{}.history", id), elems, true, &history[i]));
    // A chunk no gradient had reached, or a checkpoint of another algorithm, has none: the rule
    // starts that state afresh (DC-ASGD-a from its next gradient's g²).
    for (size_t k = 0; k < expect.rule_states.size(); ++k) {
      DP_RETURN_IF_ERROR(find(fmt::format("chunk{}.{}", id, expect.rule_states[k]), elems, false, &rule_state[i][k]));
    }
  }
  out->chunks.resize(n);
  for (size_t i = 0; i < n; ++i) {
    ShardCheckpoint::Chunk& ch = out->chunks[i];
    ch.id = expect.chunk_ids[i];
    ch.version = versions[i];
    ch.iter = iters[i];
    ch.initialized = inited[i] != 0;
    ch.weights = std::move(weights[i]->data);
    ch.history = std::move(history[i]->data);
    for (size_t k = 0; k < expect.rule_states.size(); ++k) {
      if (rule_state[i][k] != nullptr) ch.rule_state[expect.rule_states[k]] = std::move(rule_state[i][k]->data);
    }
  }
  return Status::Ok();
}

}  // namespace downpour
