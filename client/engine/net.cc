// net.cc — the backend-generic net executor. See net.h.
#include "client/engine/net.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "client/engine/fillers.h"
#include "client/engine/ref_kernels.h"
#include "common/solver/sgd.h"
#include "common/solver/update_rule.h"
#include "common/tensor_file.h"

namespace downpour::engine {

Net::Net(NetSpec spec, NetOptions options, std::unique_ptr<Backend> backend)
    : spec_(std::move(spec)), options_(options), backend_(std::move(backend)) {}

Net::~Net() {
  // A device backend throws on a device error (a sticky one fails every call after it): here that
  // is reported and the rest released, as a throw out of a destructor would end the process.
  const auto quietly = [](const char* what, auto&& release) {
    try {
      release();
    } catch (const std::exception& e) {
      spdlog::error("net: releasing {}: {}", what, e.what());
    }
  };
  layers_.clear();  // layers own blob storage; drop them before the backend
  if (data_blob_) quietly("the input", [&] { backend_->ReleaseInput(data_blob_); });
  if (label_blob_) quietly("the labels", [&] { backend_->ReleaseInput(label_blob_); });
  if (host_grads16_ || host_params16_) quietly("16-bit host buffers", [&] { backend_->Synchronize(); });
  if (host_grads16_) quietly("16-bit gradients", [&] { backend_->FreeHost(host_grads16_); });
  if (host_params16_) quietly("16-bit weights", [&] { backend_->FreeHost(host_params16_); });
  if (device_params_) quietly("the weights", [&] { backend_->Free(device_params_); });
  if (device_grads_) quietly("the gradients", [&] { backend_->Free(device_grads_); });
}

// SetGradDType / SetWeightDType in 16 bits: a device backend, its 16-bit copy of `device`
// reserved, and a host buffer of 16-bit values in `*host`.
Status Net::Prepare16(const char* what, const float* device, uint16_t** host) {
  if (backend_->memory_is_host())
    return InvalidArgument("net '{}': 16-bit {} need a device backend; {} keeps them in host memory", spec_.name, what,
                           backend_->name());
  DP_RETURN_IF_ERROR(backend_->PrepareCast(device));
  if (*host == nullptr) {
    *host = static_cast<uint16_t*>(backend_->AllocateHost(static_cast<size_t>(num_params_) * sizeof(uint16_t)));
    std::fill_n(*host, num_params_, uint16_t{0});
  }
  return Status::Ok();
}

Status Net::SetWeightDType(DType dtype) {
  if (dtype != DType::kF32) DP_RETURN_IF_ERROR(Prepare16("weight uploads", device_params_, &host_params16_));
  // Turned off: params() gets the weights the net computed on back.
  if (dtype == DType::kF32 && weight_dtype_ != DType::kF32) WidenTo(host_params16_, weight_dtype_, params());
  weight_dtype_ = dtype;
  return Status::Ok();
}

void Net::UploadParams(int64_t offset, int64_t count) {
  if (weight_dtype_ != DType::kF32) {
    backend_->UploadWeightsCast(host_params16_ + offset, device_params_ + offset, count, weight_dtype_);
  } else {
    backend_->UploadWeights(host_params_ + offset, device_params_ + offset, count);
  }
}

Status Net::SetGradDType(DType dtype) {
  if (dtype != DType::kF32) DP_RETURN_IF_ERROR(Prepare16("gradient downloads", device_grads_, &host_grads16_));
  grad_dtype_ = dtype;
  return Status::Ok();
}

Status Net::CreateWithBackend(const NetSpec& spec, const NetOptions& options,
                              std::unique_ptr<Backend> backend, std::unique_ptr<Net>* net) {
  if (backend == nullptr) return InvalidArgument("{}: no backend given", spec.source);
  std::unique_ptr<Net> n(new Net(spec, options, std::move(backend)));
  n->backend_->SetThreads(options.worker.threads);
  DP_RETURN_IF_ERROR(n->Build());
  *net = std::move(n);
  return Status::Ok();
}

Status Net::Build() {
  batch_ = options_.batch;
  DP_RETURN_IF_ERROR(InferShapes(spec_, batch_, &shapes_));
  // One contiguous parameter buffer and one gradient buffer, net order.
  param_offsets_.clear();
  num_params_ = 0;
  for (const auto& p : shapes_.params) {
    param_offsets_.push_back(num_params_);
    num_params_ += p.numel();
  }
  const int64_t alloc = std::max<int64_t>(num_params_, 1);
  device_params_ = backend_->Allocate(alloc);
  device_grads_ = backend_->Allocate(alloc);
  if (backend_->memory_is_host()) {
    host_params_ = device_params_;
    host_grads_ = device_grads_;
  } else {
    host_params_storage_.assign(alloc, 0.0f);
    host_grads_storage_.assign(alloc, 0.0f);
    host_params_ = host_params_storage_.data();
    host_grads_ = host_grads_storage_.data();
  }

  std::map<std::string, Blob*> by_name;
  for (const auto& [name, shape] : shapes_.blobs) {
    blobs_.push_back(std::make_unique<Blob>());
    blobs_.back()->name = name;
    blobs_.back()->shape = shape;
    by_name[name] = blobs_.back().get();
  }
  data_blob_ = by_name.at("data");
  label_blob_ = by_name.at("label");

  for (size_t li = 0; li < spec_.layers.size(); ++li) {
    const LayerSpec& l = spec_.layers[li];
    LayerContext ctx;
    ctx.spec = &spec_.layers[li];
    ctx.index = static_cast<int>(li);
    ctx.seed = SplitMix64(0x5EEDull + li);  // replaced by InitParams(seed)
    for (int pi : shapes_.layer_params[li])
      ctx.params.push_back(ParamSlot{shapes_.params[pi], device_params_ + param_offsets_[pi],
                                     device_grads_ + param_offsets_[pi]});
    std::unique_ptr<Layer> layer;
    DP_RETURN_IF_ERROR(backend_->CreateLayer(ctx, &layer));
    layers_.push_back(std::move(layer));
    std::vector<Blob*> bottoms, tops;
    std::vector<bool> down;
    for (size_t b = 0; b < l.bottoms.size(); ++b) {
      bottoms.push_back(by_name.at(l.bottoms[b]));
      // Gradient flows into bottom 0 unless it is the net's input or the layer has none.
      down.push_back(b == 0 && l.bottoms[b] != "data" && LayerTypeOf(l.type).sends_gradient);
    }
    for (const auto& t : l.tops) tops.push_back(by_name.at(t));
    bottoms_.push_back(std::move(bottoms));
    tops_.push_back(std::move(tops));
    propagate_down_.push_back(std::move(down));
  }
  return SetupBlobs();
}

Status Net::SetupBlobs() {
  for (auto& b : blobs_) b->shape = shapes_.blobs.at(b->name);
  std::vector<float> zeros(std::max(data_blob_->count(), label_blob_->count()), 0.0f);
  backend_->SetInput(zeros.data(), data_blob_);
  backend_->SetInput(zeros.data(), label_blob_);
  for (size_t li = 0; li < layers_.size(); ++li) {
    Status s = layers_[li]->Reshape(bottoms_[li], tops_[li]);
    if (!s.ok())
      return Status(s.code(), fmt::format("{}: layer '{}': {}", spec_.source, spec_.layers[li].name,
                                          s.message()));
  }
  return Status::Ok();
}

Status Net::Reshape(int batch) {
  if (batch == batch_) return Status::Ok();
  NetShapes shapes;
  DP_RETURN_IF_ERROR(InferShapes(spec_, batch, &shapes));
  if (has_input_normalization() && batch > input_batch_) {  // the byte input's buffers grow with it
    DP_RETURN_IF_ERROR(backend_->PrepareInput(input_norm_, batch));
    input_batch_ = batch;
  }
  shapes_.blobs = shapes.blobs;
  batch_ = batch;
  return SetupBlobs();
}

int64_t Net::input_count() const {
  return int64_t(batch_) * spec_.input_channels * spec_.input_height * spec_.input_width;
}

std::span<float> Net::param(int i) {
  return {host_params_ + param_offsets_[i], static_cast<size_t>(shapes_.params[i].numel())};
}
std::span<float> Net::grad(int i) {
  return {host_grads_ + param_offsets_[i], static_cast<size_t>(shapes_.params[i].numel())};
}

void Net::InitParams(uint64_t seed) {
  seed_ = seed;
  for (size_t li = 0; li < spec_.layers.size(); ++li) {
    const auto& pis = shapes_.layer_params[li];
    for (size_t k = 0; k < pis.size(); ++k) {
      const int pi = pis[k];
      const FillerSpec& f = k == 0 ? spec_.layers[li].weight_filler : spec_.layers[li].bias_filler;
      FillTensor(f, shapes_.params[pi], seed, static_cast<uint64_t>(pi), param(pi));
    }
  }
  UploadAllParams();
}

Status Net::CheckLabels(const int* labels, int n) const {
  for (int i = 0; i < n; ++i) {
    if (labels[i] >= 0 && labels[i] < shapes_.num_classes) continue;
    const LayerSpec& loss = spec_.layers[shapes_.loss_layer];
    return InvalidArgument(
        "net '{}' ({}): label {} at position {} of the batch is outside [0, {}), the classes of loss "
        "layer '{}' (scores '{}', labels '{}')",
        spec_.name, spec_.source.empty() ? "not from a file" : spec_.source, labels[i], i, shapes_.num_classes,
        loss.name, loss.bottoms[0], loss.bottoms[1]);
  }
  return Status::Ok();
}

void Net::SetInputs(const float* images, const int* labels) {
  backend_->SetInput(images, data_blob_);
  SetLabels(labels);
}

void Net::SetLabels(const int* labels) {
  label_staging_.resize(batch_);
  for (int i = 0; i < batch_; ++i) {
    // Invariant: the caller ran CheckLabels on data it did not produce itself.
    DP_CHECK_GE(labels[i], 0);
    DP_CHECK_LT(labels[i], shapes_.num_classes);
    label_staging_[i] = static_cast<float>(labels[i]);
  }
  backend_->SetInput(label_staging_.data(), label_blob_);
}

void Net::RunForward(Phase phase) {
  const bool upload = !backend_->memory_is_host();
  // Without a per-layer callback the weights are final now: one upload. With one, each layer's
  // weights are final only once its callback returned (they may still be arriving).
  if (upload && !before_layer_) UploadParams(0, num_params_);
  for (size_t li = 0; li < layers_.size(); ++li) {
    if (before_layer_) {
      before_layer_(static_cast<int>(li));
      if (upload) {
        for (int pi : shapes_.layer_params[li]) UploadParams(param_offsets_[pi], shapes_.params[pi].numel());
      }
    }
    // Masks depend on (init seed, step, layer) only.
    layers_[li]->SetStep(static_cast<int64_t>(SplitMix64(seed_ * 1000003ull + step_) ^ li));
    layers_[li]->Forward(phase, bottoms_[li], tops_[li]);
  }
}

float Net::ReadScalar(const Blob& blob) {
  float v = 0.0f;
  backend_->ReadBlob(blob, &v);
  return v;
}

std::vector<float> Net::ReadScores() {
  const Blob& scores = *bottoms_[shapes_.loss_layer][0];
  std::vector<float> host(scores.count());
  backend_->ReadBlob(scores, host.data());
  return host;
}

Status Net::ReadBlob(const std::string& name, std::vector<float>* host) {
  for (const auto& b : blobs_) {
    if (b->name != name) continue;
    host->resize(b->count());
    backend_->ReadBlob(*b, host->data());
    return Status::Ok();
  }
  return NotFound("net '{}': no blob '{}'", spec_.name, name);
}

void Net::AccuracyFromScores(const int* labels, int k, float* top1, float* topk) {
  const std::vector<float> s = ReadScores();
  const int c = shapes_.num_classes;
  int c1 = 0, ck = 0;
  for (int i = 0; i < batch_; ++i) {
    const int above = ref::ScoresAboveLabel(s.data() + int64_t(i) * c, c, labels[i]);
    c1 += above < 1;
    ck += above < k;
  }
  *top1 = float(c1) / batch_;
  *topk = float(ck) / batch_;
}

Status Net::SetEmulatedCompute(std::vector<float> ms) {
  if (!ms.empty() && ms.size() != 2 * layers_.size()) {
    return InvalidArgument(
        "worker.emulate_ms has {} values; model {} has {} layers: expected {} (a forward and a backward ms per "
        "layer, in net order)",
        ms.size(), spec_.name, layers_.size(), 2 * layers_.size());
  }
  for (float m : ms) {
    if (!std::isfinite(m) || m < 0) return InvalidArgument("worker.emulate_ms: {} ms: must be finite and >= 0", m);
  }
  emulate_ms_ = std::move(ms);
  return Status::Ok();
}

void Net::EmulateKernel(float ms) {
  const auto now = std::chrono::steady_clock::now();
  emulate_due_ = std::max(emulate_due_, now) +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double, std::milli>(ms));
  std::this_thread::sleep_until(emulate_due_);
}

Status Net::SetInputNormalization(InputNormalization norm, const std::string& what) {
  DP_RETURN_IF_ERROR(norm.Check(what.c_str()));
  if (norm.channels != spec_.input_channels || norm.height != spec_.input_height || norm.width != spec_.input_width)
    return InvalidArgument("{}: images of {}x{}x{}; net '{}' ({}) takes {}x{}x{}", what, norm.channels, norm.height,
                           norm.width, spec_.name, spec_.source.empty() ? "not from a file" : spec_.source,
                           spec_.input_channels, spec_.input_height, spec_.input_width);
  DP_RETURN_IF_ERROR(backend_->PrepareInput(norm, batch_));
  input_norm_ = std::move(norm);
  input_batch_ = batch_;
  return Status::Ok();
}

float Net::ForwardBackward(const float* images, const int* labels) {
  ++step_;
  SetInputs(images, labels);
  return TrainStep(labels, nullptr);
}

float Net::ForwardBackward(const ByteBatch& batch, const int* labels, const ByteBatch* next) {
  DP_CHECK(has_input_normalization());
  DP_CHECK_EQ(batch.n, batch_);
  ++step_;
  backend_->NormalizeInput(input_norm_, batch, data_blob_);
  SetLabels(labels);
  return TrainStep(labels, next);
}

float Net::TrainStep(const int* labels, const ByteBatch* next) {
  if (emulated()) {
    // No kernel runs (SetEmulatedCompute): the callbacks come at a real step's points.
    emulate_due_ = std::chrono::steady_clock::now();
    for (size_t li = 0; li < layers_.size(); ++li) {
      if (before_layer_) before_layer_(static_cast<int>(li));
      EmulateKernel(emulate_ms_[2 * li]);
    }
    if (next != nullptr) backend_->StageInput(*next);
    for (int li = num_layers() - 1; li >= 0; --li) BackwardLayer(li);
    last_accuracy_ = 0.0f;
    return 0.0f;
  }
  RunForward(Phase::kTrain);
  // The next batch's upload goes after this step's weight uploads and beside its backward.
  if (next != nullptr) backend_->StageInput(*next);
  for (int li = num_layers() - 1; li >= 0; --li) {
    QueueBackward(li);
    DeliverGrads(/*wait=*/false);
  }
  DeliverGrads(/*wait=*/true);
  // Read back at the end only: a read-back waits for everything queued.
  const float loss = ReadScalar(*tops_[shapes_.loss_layer][0]);
  float topk = 0.0f;
  AccuracyFromScores(labels, 1, &last_accuracy_, &topk);
  return loss;
}

EvalResult Net::Forward(const float* images, const int* labels) {
  SetInputs(images, labels);
  return Evaluate(labels, nullptr);
}

EvalResult Net::Forward(const ByteBatch& batch, const int* labels, const ByteBatch* next) {
  DP_CHECK(has_input_normalization());
  DP_CHECK_EQ(batch.n, batch_);
  DP_CHECK(next == nullptr || next->n <= input_batch_);
  backend_->NormalizeInput(input_norm_, batch, data_blob_);
  SetLabels(labels);
  return Evaluate(labels, next);
}

EvalResult Net::Evaluate(const int* labels, const ByteBatch* next) {
  RunForward(Phase::kTest);
  if (next != nullptr) backend_->StageInput(*next);  // its upload beside this forward
  EvalResult r;
  r.loss = ReadScalar(*tops_[shapes_.loss_layer][0]);
  AccuracyFromScores(labels, std::min(options_.top_k, shapes_.num_classes), &r.top1, &r.topk);
  return r;
}

void Net::ForwardLayer(int i, Phase phase) { layers_[i]->Forward(phase, bottoms_[i], tops_[i]); }

void Net::BackwardLayer(int li) {
  QueueBackward(li);
  DeliverGrads(/*wait=*/true);
}

// Hands finished gradients to the callback in the order they were queued (later layers first,
// bias before weight): those whose download has landed, or, with `wait`, all of them.
void Net::DeliverGrads(bool wait) {
  while (!pending_grads_.empty()) {
    const PendingGrad p = pending_grads_.front();
    if (!wait && !backend_->CopyDone(p.ticket)) return;
    backend_->WaitCopy(p.ticket);
    pending_grads_.pop_front();
    if (grad_ready_) grad_ready_(p.tensor);
  }
}

void Net::QueueBackward(int li) {
  if (before_backward_ && !shapes_.layer_params[li].empty()) before_backward_(li);
  if (emulated()) EmulateKernel(emulate_ms_[2 * static_cast<size_t>(li) + 1]);
  if (!layers_[li]->HasBackward()) return;
  const auto& pis = shapes_.layer_params[li];
  const bool any_down = std::any_of(propagate_down_[li].begin(), propagate_down_[li].end(),
                                    [](bool b) { return b; });
  if (!any_down && pis.empty()) return;
  // A factored weight whose factors pay at this batch: the layer need not compute dW.
  const bool factors = !pis.empty() && FactorsPay(li, pis[0]);
  if (!factor_layer_.empty() && !pis.empty()) factored_now_[static_cast<size_t>(pis[0])] = factors;
  layers_[li]->set_skip_weight_grad(factors);
  if (!emulated()) layers_[li]->Backward(tops_[li], propagate_down_[li], bottoms_[li]);
  for (auto it = pis.rbegin(); it != pis.rend(); ++it) {
    uint64_t ticket = 0;
    if (grad_is_factored(*it)) {
      ticket = WriteFactors(li, *it);  // no dW download: the factors are the tensor's gradient this step
    } else if (grad_dtype_ != DType::kF32) {
      // Cast on the device, half the bytes down (SetGradDType).
      ticket = backend_->CopyToHostCastAsync(device_grads_ + param_offsets_[*it], host_grads16_ + param_offsets_[*it],
                                             shapes_.params[*it].numel(), grad_dtype_);
    } else if (!backend_->memory_is_host()) {
      // Started now, waited for by DeliverGrads: the layers below are queued meanwhile.
      ticket = backend_->CopyToHostAsync(device_grads_ + param_offsets_[*it], host_grads_ + param_offsets_[*it],
                                         shapes_.params[*it].numel());
    }
    pending_grads_.push_back(PendingGrad{*it, ticket});
  }
}

bool Net::InnerProductDims(int tensor, int64_t* out, int64_t* in) const {
  for (size_t li = 0; li < spec_.layers.size(); ++li) {
    const auto& pis = shapes_.layer_params[li];
    if (spec_.layers[li].type != LayerType::kInnerProduct || pis.empty() || pis[0] != tensor) continue;
    const TensorSpec& w = shapes_.params[static_cast<size_t>(tensor)];
    *out = w.shape.at(0);
    *in = w.numel() / w.shape.at(0);
    return true;
  }
  return false;
}

Status Net::SetFactoredParams(const std::vector<int>& tensors, const std::vector<std::vector<RowSpan>>& blocks) {
  if (!blocks.empty() && blocks.size() != tensors.size())
    return InvalidArgument("net '{}': {} factored tensors but row blocks for {}", spec_.name, tensors.size(),
                           blocks.size());
  std::vector<int> layer_of(shapes_.params.size(), -1);
  std::vector<std::vector<RowSpan>> blocks_of(shapes_.params.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int t = tensors[i];
    if (t < 0 || t >= static_cast<int>(shapes_.params.size()))
      return InvalidArgument("net '{}': factored tensor index {} is outside [0, {})", spec_.name, t,
                             shapes_.params.size());
    const std::string& name = shapes_.params[static_cast<size_t>(t)].name;
    int64_t out = 0, in = 0;
    if (!InnerProductDims(t, &out, &in))
      return InvalidArgument(
          "net '{}': tensor '{}' cannot carry sufficient factors: only inner-product "
          "weights can",
          spec_.name, name);
    std::vector<RowSpan> b = blocks.empty() ? std::vector<RowSpan>{} : blocks[i];
    if (b.empty()) b.push_back(RowSpan{0, out});
    int64_t end = 0;  // rows covered so far
    for (const RowSpan& k : b) {
      if (k.rows < 1 || k.first < 0 || k.first > end || k.first + k.rows > out)
        return InvalidArgument(
            "net '{}': tensor '{}' ({} rows): row block [{}, {}) does not continue the blocks "
            "before it (rows [0, {}) covered) inside [0, {})",
            spec_.name, name, out, k.first, k.first + k.rows, end, out);
      end = std::max(end, k.first + k.rows);
    }
    if (end != out)
      return InvalidArgument("net '{}': tensor '{}': its row blocks cover rows [0, {}) of {}", spec_.name, name, end,
                             out);
    blocks_of[static_cast<size_t>(t)] = std::move(b);
    for (size_t li = 0; li < spec_.layers.size(); ++li)
      if (!shapes_.layer_params[li].empty() && shapes_.layer_params[li][0] == t) layer_of[t] = static_cast<int>(li);
  }
  factor_layer_ = tensors.empty() ? std::vector<int>{} : std::move(layer_of);
  factor_blocks_ = tensors.empty() ? std::vector<std::vector<RowSpan>>{} : std::move(blocks_of);
  factored_now_.assign(factor_layer_.empty() ? 0 : shapes_.params.size(), false);
  return Status::Ok();
}

// Whether tensor t is layer li's factored weight and its factors are fewer floats than dW at
// the current batch (B×(packed rows+in) < out×in; they then also fit in its gradient span).
bool Net::FactorsPay(int li, int t) const {
  if (factor_layer_.empty() || factor_layer_[static_cast<size_t>(t)] != li) return false;
  const int64_t numel = shapes_.params[static_cast<size_t>(t)].numel();
  const int64_t out = shapes_.params[static_cast<size_t>(t)].shape[0], in = numel / out;
  const int64_t rows = PackedRows(factor_blocks_[static_cast<size_t>(t)]);
  return int64_t{bottoms_[li][0]->shape[0]} * (rows + in) < numel;
}

// After layer li's backward, for its factored weight t: [δ packed (B×rows) | a (B×in)] at the
// start of t's host gradient span (grads16()'s in 16 bits), in canonical dense layouts on every
// backend. Neither blob is written again this step, so both reads start without waiting; the
// later of their tickets is returned. The device packs δ (and in 16 bits a too) into t's own
// gradient window (the layer skipped dW there; B×(rows+in) < its numel when factors pay).
uint64_t Net::WriteFactors(int li, int t) {
  const int64_t numel = shapes_.params[static_cast<size_t>(t)].numel();
  const int64_t out = shapes_.params[static_cast<size_t>(t)].shape[0], in = numel / out;
  const Blob& top = *tops_[li][0];
  const Blob& bottom = *bottoms_[li][0];
  const int64_t b = bottom.shape[0];
  DP_CHECK_EQ(top.count(), b * out);
  DP_CHECK_EQ(bottom.count(), b * in);
  const std::vector<RowSpan>& blocks = factor_blocks_[static_cast<size_t>(t)];
  const int64_t rows = PackedRows(blocks);
  if (grad_dtype_ != DType::kF32) {  // in 16 bits, as the other gradients (SetGradDType)
    return backend_->ReadFactorsCastAsync(top, blocks, bottom, device_grads_ + param_offsets_[t],
                                          host_grads16_ + param_offsets_[t], grad_dtype_);
  }
  float* span = host_grads_ + param_offsets_[t];
  const bool as_is = blocks.size() == 1 && blocks[0].first == 0 && blocks[0].rows == out;
  const uint64_t delta = as_is
                             ? backend_->ReadBlobGradAsync(top, span)  // δ: B×out
                             : backend_->ReadBlobGradBlocksAsync(top, blocks, device_grads_ + param_offsets_[t], span);
  const uint64_t a = backend_->ReadBlobAsync(bottom, span + b * rows);  // a: B×in
  return std::max(delta, a);
}

void Net::SgdUpdate(float lr, float momentum, float weight_decay, std::span<float> history) {
  Update(MomentumRule(), lr, momentum, weight_decay, history);
}

void Net::Update(const UpdateRule& rule, float lr, float momentum, float weight_decay, std::span<float> history) {
  DP_CHECK_EQ(static_cast<int64_t>(history.size()), num_params_);
  // The servers' rule (common/solver), per tensor with its multipliers, in blocks over threads
  // (element-wise, so the blocking changes no bit).
  constexpr int64_t kBlock = 1 << 16;
  for (size_t i = 0; i < shapes_.params.size(); ++i) {
    UpdateParams p;
    p.lr = lr;
    p.momentum = momentum;
    p.weight_decay = weight_decay;
    p.lr_mult = shapes_.params[i].lr_mult;
    p.decay_mult = shapes_.params[i].decay_mult;
    const int64_t off = param_offsets_[i];
    const int64_t n = shapes_.params[i].numel();
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = b * kBlock;
      const auto len = static_cast<size_t>(std::min(kBlock, n - at));
      rule.Apply(p, std::span<const float>(host_grads_ + off + at, len), std::span<float>(host_params_ + off + at, len),
                 history.subspan(off + at, len));
    }
  }
}

namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

Status Net::SaveWeights(const std::string& path) const {
  TensorFile file;
  file.meta["kind"] = "engine-weights";
  file.meta["model"] = spec_.name;
  file.meta["step"] = std::to_string(step_);
  for (size_t i = 0; i < shapes_.params.size(); ++i) {
    const TensorSpec& t = shapes_.params[i];
    const float* p = host_params_ + param_offsets_[i];
    file.tensors.push_back(NamedTensor{t.name, t.shape, std::vector<float>(p, p + t.numel())});
  }
  return WriteTensorFile(path, file);
}

Status Net::LoadWeights(const std::string& path) {
  TensorFile file;
  DP_RETURN_IF_ERROR(ReadTensorFile(path, &file));
  // Check everything before touching a weight: a bad file leaves the net as it was.
  for (const TensorSpec& t : shapes_.params) {
    const NamedTensor* found = FindTensor(file, t.name);
    if (found == nullptr)
      return NotFound("{}: tensor '{}' of model '{}' is missing from the file", path, t.name,
                      spec_.name);
    if (found->shape != t.shape)
      return InvalidArgument("{}: tensor '{}' has shape {} in the file but {} in model '{}'", path,
                             t.name, ShapeText(found->shape), ShapeText(t.shape), spec_.name);
  }
  for (const NamedTensor& t : file.tensors) {
    const bool known = std::any_of(shapes_.params.begin(), shapes_.params.end(),
                                   [&](const TensorSpec& p) { return p.name == t.name; });
    if (!known)
      return InvalidArgument("{}: tensor '{}' in the file is not a parameter of model '{}'", path,
                             t.name, spec_.name);
  }
  for (size_t i = 0; i < shapes_.params.size(); ++i) {
    const NamedTensor* t = FindTensor(file, shapes_.params[i].name);
    std::copy(t->data.begin(), t->data.end(), host_params_ + param_offsets_[i]);
  }
  UploadAllParams();
  return Status::Ok();
}

// CopyToDevice may read params() after it returns, until the next Synchronize (Backend's
// contract); the caller's next write to them (a worker's first pull, on its client's thread)
// must not race that read, so the upload is waited for here, once, outside any step.
void Net::UploadAllParams() {
  if (backend_->memory_is_host()) return;
  backend_->CopyToDevice(host_params_, device_params_, num_params_);
  backend_->Synchronize();
}

}  // namespace downpour::engine
