// factor_expander.cc — see factor_expander.h.
#include "server/factor_expander.h"

#include <chrono>

#include "server/elapsed.h"
#include "server/factor_push.h"

namespace downpour {

FactorExpander::FactorExpander(const ParamLayout& layout, FactorExpanderOptions options)
    : layout_(layout), o_(std::move(options)), scratch_(o_.scratch_elems) {
  if (o_.trace != nullptr && o_.trace->on()) track_ = o_.trace->Thread(o_.track);
  thread_ = std::thread([this] { Run(); });
}

FactorExpander::~FactorExpander() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void FactorExpander::Submit(std::unique_ptr<FactorJob> job) {
  std::unique_lock<std::mutex> lock(mu_);
  // Bounded: what is queued or running (the finished ones wait for the loop's next TakeDone).
  progress_.wait(lock, [this] { return queue_.size() + (running_ ? 1 : 0) < kMaxInFlight; });
  queue_.push_back(std::move(job));
  cv_.notify_one();
}

std::vector<std::unique_ptr<FactorJob>> FactorExpander::TakeDone() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::unique_ptr<FactorJob>> out;
  while (!done_.empty()) {
    out.push_back(std::move(done_.front()));
    done_.pop_front();
  }
  return out;
}

void FactorExpander::WaitAll() {
  std::unique_lock<std::mutex> lock(mu_);
  progress_.wait(lock, [this] { return queue_.empty() && !running_; });
}

size_t FactorExpander::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + (running_ ? 1 : 0) + done_.size();
}

void FactorExpander::Run() {
  while (true) {
    std::unique_ptr<FactorJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted is done
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    {
      TraceSpan span(track_ >= 0 ? o_.trace : nullptr, track_, "server", "factors");
      span.Arg("worker", job->header.sender);
      span.Arg("chunks", static_cast<double>(job->header.chunk_ids.size()));
      const auto t0 = std::chrono::steady_clock::now();
      job->status =
          ExpandFactorPush(layout_, &job->header, &job->frames, &job->reason, &scratch_, o_.threads, &job->finite);
      busy_ns_.fetch_add(NanosSince(t0), std::memory_order_relaxed);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(job));
      running_ = false;
    }
    progress_.notify_all();
    if (o_.wake) o_.wake();
  }
}

}  // namespace downpour
