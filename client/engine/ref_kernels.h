// ref_kernels.h — the plain reference implementation of every layer: naive loops over
// canonical dense row-major tensors, templated on the scalar type so gradient checks run in
// double. This is the source of truth the fast backends are tested against; it favours
// obviousness over speed. Definitions follow Caffe (conv with groups, LRN across channels,
// max and average pooling with ceil output size, inner product, softmax cross-entropy).
//
// Shapes in comments: x (N,C,H,W), w (O,C/g,kh,kw), y (N,O,Ho,Wo).
// Backward functions OVERWRITE their outputs (dx, dw, db); any pointer may be null to skip.
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace downpour::engine::ref {

struct ConvGeom {
  int n, c, h, w;        // input
  int o, kh, kw;         // output channels, kernel
  int sh, sw, ph, pw;    // stride, pad
  int group;
  int ho, wo;            // output size
};

template <typename T>
void ConvForward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y) {
  const int cg = g.c / g.group, og = g.o / g.group;
  for (int n = 0; n < g.n; ++n)
    for (int o = 0; o < g.o; ++o) {
      const int gi = o / og;
      for (int oh = 0; oh < g.ho; ++oh)
        for (int ow = 0; ow < g.wo; ++ow) {
          T sum = b ? b[o] : T(0);
          for (int ic = 0; ic < cg; ++ic)
            for (int i = 0; i < g.kh; ++i)
              for (int j = 0; j < g.kw; ++j) {
                const int ih = oh * g.sh - g.ph + i, iw = ow * g.sw - g.pw + j;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                sum += x[((int64_t(n) * g.c + gi * cg + ic) * g.h + ih) * g.w + iw] *
                       w[((int64_t(o) * cg + ic) * g.kh + i) * g.kw + j];
              }
          y[((int64_t(n) * g.o + o) * g.ho + oh) * g.wo + ow] = sum;
        }
    }
}

template <typename T>
void ConvBackward(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dx, T* dw, T* db) {
  const int cg = g.c / g.group, og = g.o / g.group;
  if (dx) std::fill(dx, dx + int64_t(g.n) * g.c * g.h * g.w, T(0));
  if (dw) std::fill(dw, dw + int64_t(g.o) * cg * g.kh * g.kw, T(0));
  if (db) std::fill(db, db + g.o, T(0));
  for (int n = 0; n < g.n; ++n)
    for (int o = 0; o < g.o; ++o) {
      const int gi = o / og;
      for (int oh = 0; oh < g.ho; ++oh)
        for (int ow = 0; ow < g.wo; ++ow) {
          const T d = dy[((int64_t(n) * g.o + o) * g.ho + oh) * g.wo + ow];
          if (db) db[o] += d;
          for (int ic = 0; ic < cg; ++ic)
            for (int i = 0; i < g.kh; ++i)
              for (int j = 0; j < g.kw; ++j) {
                const int ih = oh * g.sh - g.ph + i, iw = ow * g.sw - g.pw + j;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const int64_t xi = ((int64_t(n) * g.c + gi * cg + ic) * g.h + ih) * g.w + iw;
                const int64_t wi = ((int64_t(o) * cg + ic) * g.kh + i) * g.kw + j;
                if (dw) dw[wi] += d * x[xi];
                if (dx) dx[xi] += d * w[wi];
              }
        }
    }
}

template <typename T>
void ReluForward(int64_t count, const T* x, T* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}
template <typename T>
void ReluBackward(int64_t count, const T* x, const T* dy, T* dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = x[i] > T(0) ? dy[i] : T(0);
}

struct LrnGeom {
  int n, c, h, w;
  int size;
  double alpha, beta, k;
};

// scale (N,C,H,W) = k + alpha/size * sum over the channel window of x^2; y = x * scale^-beta.
template <typename T>
void LrnForward(const LrnGeom& g, const T* x, T* y, T* scale) {
  const int pre = (g.size - 1) / 2;
  const int64_t plane = int64_t(g.h) * g.w;
  for (int n = 0; n < g.n; ++n)
    for (int c = 0; c < g.c; ++c)
      for (int64_t p = 0; p < plane; ++p) {
        T sum = 0;
        for (int cc = std::max(0, c - pre); cc <= std::min(g.c - 1, c + pre); ++cc) {
          const T v = x[(int64_t(n) * g.c + cc) * plane + p];
          sum += v * v;
        }
        const int64_t i = (int64_t(n) * g.c + c) * plane + p;
        scale[i] = T(g.k) + T(g.alpha / g.size) * sum;
        y[i] = x[i] * std::pow(scale[i], T(-g.beta));
      }
}

// dx = dy * scale^-beta - 2*alpha*beta/size * x * sum_{window} dy*y/scale.
template <typename T>
void LrnBackward(const LrnGeom& g, const T* x, const T* y, const T* scale, const T* dy, T* dx) {
  const int pre = (g.size - 1) / 2;
  const int64_t plane = int64_t(g.h) * g.w;
  const T coeff = T(2 * g.alpha * g.beta / g.size);
  for (int n = 0; n < g.n; ++n)
    for (int c = 0; c < g.c; ++c)
      for (int64_t p = 0; p < plane; ++p) {
        T acc = 0;
        for (int cc = std::max(0, c - pre); cc <= std::min(g.c - 1, c + pre); ++cc) {
          const int64_t j = (int64_t(n) * g.c + cc) * plane + p;
          acc += dy[j] * y[j] / scale[j];
        }
        const int64_t i = (int64_t(n) * g.c + c) * plane + p;
        dx[i] = dy[i] * std::pow(scale[i], T(-g.beta)) - coeff * x[i] * acc;
      }
}

struct PoolGeom {
  int n, c, h, w;
  int kh, kw, sh, sw, ph, pw;
  int ho, wo;
};

// Max pooling; argmax (N,C,Ho,Wo) holds the flat input index of each maximum.
template <typename T>
void MaxPoolForward(const PoolGeom& g, const T* x, T* y, int64_t* argmax) {
  for (int n = 0; n < g.n; ++n)
    for (int c = 0; c < g.c; ++c) {
      const int64_t base = (int64_t(n) * g.c + c) * g.h * g.w;
      for (int oh = 0; oh < g.ho; ++oh)
        for (int ow = 0; ow < g.wo; ++ow) {
          const int hs = std::max(oh * g.sh - g.ph, 0), ws = std::max(ow * g.sw - g.pw, 0);
          const int he = std::min(oh * g.sh - g.ph + g.kh, g.h), we = std::min(ow * g.sw - g.pw + g.kw, g.w);
          T best = -std::numeric_limits<T>::max();
          int64_t best_i = -1;
          for (int ih = hs; ih < he; ++ih)
            for (int iw = ws; iw < we; ++iw) {
              const int64_t i = base + int64_t(ih) * g.w + iw;
              if (x[i] > best) { best = x[i]; best_i = i; }
            }
          const int64_t o = ((int64_t(n) * g.c + c) * g.ho + oh) * g.wo + ow;
          y[o] = best;
          argmax[o] = best_i;
        }
    }
}

template <typename T>
void MaxPoolBackward(const PoolGeom& g, const int64_t* argmax, const T* dy, T* dx) {
  std::fill(dx, dx + int64_t(g.n) * g.c * g.h * g.w, T(0));
  const int64_t out = int64_t(g.n) * g.c * g.ho * g.wo;
  for (int64_t o = 0; o < out; ++o)
    if (argmax[o] >= 0) dx[argmax[o]] += dy[o];
}

// Caffe's AVE window for output (oh, ow): [hs, he) × [ws, we) clipped to the input, and its
// divisor counted BEFORE clipping over the padded input [-ph, h+ph) × [-pw, w+pw): the zero
// padding counts, the ceil-rounding overhang beyond it does not (pooling_layer.cpp).
struct AveWindow {
  int hs, he, ws, we;
  int pool_size;
};
inline AveWindow AveWindowAt(const PoolGeom& g, int oh, int ow) {
  int hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  int he = std::min(hs + g.kh, g.h + g.ph), we = std::min(ws + g.kw, g.w + g.pw);
  const int pool_size = (he - hs) * (we - ws);
  hs = std::max(hs, 0);
  ws = std::max(ws, 0);
  he = std::min(he, g.h);
  we = std::min(we, g.w);
  return {hs, he, ws, we, pool_size};
}

// Average pooling: y (N,C,Ho,Wo) = sum over the clipped window / pool_size.
template <typename T>
void AvePoolForward(const PoolGeom& g, const T* x, T* y) {
  for (int n = 0; n < g.n; ++n)
    for (int c = 0; c < g.c; ++c) {
      const int64_t base = (int64_t(n) * g.c + c) * g.h * g.w;
      for (int oh = 0; oh < g.ho; ++oh)
        for (int ow = 0; ow < g.wo; ++ow) {
          const AveWindow win = AveWindowAt(g, oh, ow);
          T sum = 0;
          for (int ih = win.hs; ih < win.he; ++ih)
            for (int iw = win.ws; iw < win.we; ++iw) sum += x[base + int64_t(ih) * g.w + iw];
          y[((int64_t(n) * g.c + c) * g.ho + oh) * g.wo + ow] = sum / T(win.pool_size);
        }
    }
}

// dx (N,C,H,W): each output spreads dy / pool_size over its clipped window.
template <typename T>
void AvePoolBackward(const PoolGeom& g, const T* dy, T* dx) {
  std::fill(dx, dx + int64_t(g.n) * g.c * g.h * g.w, T(0));
  for (int n = 0; n < g.n; ++n)
    for (int c = 0; c < g.c; ++c) {
      const int64_t base = (int64_t(n) * g.c + c) * g.h * g.w;
      for (int oh = 0; oh < g.ho; ++oh)
        for (int ow = 0; ow < g.wo; ++ow) {
          const AveWindow win = AveWindowAt(g, oh, ow);
          const T d = dy[((int64_t(n) * g.c + c) * g.ho + oh) * g.wo + ow] / T(win.pool_size);
          for (int ih = win.hs; ih < win.he; ++ih)
            for (int iw = win.ws; iw < win.we; ++iw) dx[base + int64_t(ih) * g.w + iw] += d;
        }
    }
}

// y (N,O) = x (N,K) · w(O,K)^T + b.
template <typename T>
void InnerProductForward(int n, int k, int o, const T* x, const T* w, const T* b, T* y) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < o; ++j) {
      T sum = b ? b[j] : T(0);
      for (int q = 0; q < k; ++q) sum += x[int64_t(i) * k + q] * w[int64_t(j) * k + q];
      y[int64_t(i) * o + j] = sum;
    }
}

template <typename T>
void InnerProductBackward(int n, int k, int o, const T* x, const T* w, const T* dy, T* dx, T* dw,
                          T* db) {
  if (dx)
    for (int i = 0; i < n; ++i)
      for (int q = 0; q < k; ++q) {
        T sum = 0;
        for (int j = 0; j < o; ++j) sum += dy[int64_t(i) * o + j] * w[int64_t(j) * k + q];
        dx[int64_t(i) * k + q] = sum;
      }
  if (dw)
    for (int j = 0; j < o; ++j)
      for (int q = 0; q < k; ++q) {
        T sum = 0;
        for (int i = 0; i < n; ++i) sum += dy[int64_t(i) * o + j] * x[int64_t(i) * k + q];
        dw[int64_t(j) * k + q] = sum;
      }
  if (db)
    for (int j = 0; j < o; ++j) {
      T sum = 0;
      for (int i = 0; i < n; ++i) sum += dy[int64_t(i) * o + j];
      db[j] = sum;
    }
}

// mask holds 0 or 1/(1-ratio) per element (see fillers.h DropoutMask).
template <typename T>
void DropoutForward(int64_t count, const float* mask, const T* x, T* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = x[i] * T(mask[i]);
}
template <typename T>
void DropoutBackward(int64_t count, const float* mask, const T* dy, T* dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = dy[i] * T(mask[i]);
}

// Mean over the batch of -log softmax(x)[label]; prob (N,K) is kept for backward.
template <typename T>
T SoftmaxLossForward(int n, int k, const T* x, const float* labels, T* prob) {
  T loss = 0;
  for (int i = 0; i < n; ++i) {
    const T* row = x + int64_t(i) * k;
    T* p = prob + int64_t(i) * k;
    const T mx = *std::max_element(row, row + k);
    T sum = 0;
    for (int j = 0; j < k; ++j) sum += (p[j] = std::exp(row[j] - mx));
    for (int j = 0; j < k; ++j) p[j] /= sum;
    const int label = static_cast<int>(labels[i]);
    loss -= std::log(std::max(p[label], std::numeric_limits<T>::min()));
  }
  return loss / n;
}

// dx = (prob - onehot(label)) / N × dloss.
template <typename T>
void SoftmaxLossBackward(int n, int k, const T* prob, const float* labels, T dloss, T* dx) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < k; ++j) {
      const int64_t idx = int64_t(i) * k + j;
      dx[idx] = (prob[idx] - (j == static_cast<int>(labels[i]) ? T(1) : T(0))) * dloss / T(n);
    }
}

// How many of a row's k scores rank above its label's: those strictly larger (ties count for
// the label, as in Caffe) and any NaN, the label's own included, so a diverged net scores 0,
// not the fraction of rows whose comparisons all came out false. The label is among the top_k
// scores when this is < top_k. (The CUDA backend's accuracy kernel has the same rule.)
template <typename T>
int ScoresAboveLabel(const T* row, int k, int label) {
  const T label_score = row[label];
  int above = 0;
  for (int j = 0; j < k; ++j) above += !(row[j] <= label_score);
  return above;
}

// Fraction of rows whose label is among the top_k scores (ScoresAboveLabel).
template <typename T>
T Accuracy(int n, int k, const T* x, const float* labels, int top_k) {
  int correct = 0;
  for (int i = 0; i < n; ++i)
    correct += ScoresAboveLabel(x + int64_t(i) * k, k, static_cast<int>(labels[i])) < top_k;
  return T(correct) / T(n);
}

}  // namespace downpour::engine::ref
