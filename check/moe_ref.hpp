// The float64 reference of the MoE layer forward (kernels/moe/layer.hpp) for one token, with the
// per-element bound a correct bf16 layer stays under; the layer tests (non-fused and fused), the
// gemm_combine test (its down projection alone: moe_down_ref with exact inputs) and weave-bench moe
// check against it. Host code only.
//
//   r[t] = sum_j w[t, j] * y_e(x_t), e = idx[t, j],  y_e(x) = Wd[e] (silu(g) * u),
//   g = Wg[e] x, u = Wu[e] x  (Wg, Wu: rows 0..F-1 and F..2F-1 of W_up[e]).
//
// The bound, per output element (u8 = 2^-8, bf16's unit roundoff under round to nearest; gam(K) =
// K 2^-21, a dot product of length K accumulated in fp32 on the tensor cores, with 4x margin over
// K 2^-23; 1.1 = max |silu'|):
//  - G = bf16(fp32 X Wup^T): |g~ - g| <= eg = u8 |g| + (1 + u8) gam(H) sum_c |x_c Wg_fc|, same eu for u.
//  - H = bf16(silu(g~) u~) in fp32: |h~ - h| <= eh = (1 + u8 + q) D + (u8 + q) |h|, where
//    D = (|silu(g)| + 1.1 eg) eu + 1.1 |u| eg bounds |silu(g~) u~ - silu(g) u| and
//    q = 2^-18 + |g| 2^-22 the fp32 steps (swiglu.hpp: fast exp and division, one product).
//  - Y = bf16(fp32 H~ Wd^T): the errors of h~ enter as sum_f d_f Wd_cf with |d_f| <= eh_f. Taken
//    worst case (sum eh |Wd|) this is ~sqrt(F) times what it is in practice and as large as a
//    missing expert; the d_f are roundings of different dot products, independent and centred, so
//    Hoeffding gives P(|sum| > 8 s) <= 2 e^-32 with s = sqrt(sum_f eh_f^2 Wd_cf^2). Slots of one
//    token on the same expert share their errors: s is taken per distinct expert with the summed
//    weight W_e. Then |y~ - y| <= ey = u8 |y| + (1 + u8) gam(F) sum_f (|h_f| + eh_f) |Wd_cf|
//    (the deterministic part).
//  - out = bf16(fp32 sum_j w_j y~_j): the combine's fma chain adds 2^-19 sum_j w_j |y~_j|, and the
//    final rounding u8 |out|.
//  So |out - r| <= 1.02 (u8 |r| + sum_j w_j (ey_j + 2^-19 (|y_j| + ey_j)) + 8 sqrt(sum_e (W_e s_e)^2)) + 2^-100.
#pragma once
#include <cmath>
#include <vector>

namespace weave::check {

// One expert applied to one token: per output column, y, its deterministic bound ey and s^2.
struct MoeExpertRef {
  std::vector<double> y, ey_det, s2;
};

// The expert's activations h = silu(g) u for one token (F values) and their bounds eh (above).
struct MoeHiddenRef {
  std::vector<double> h, eh;
};

// x: the token (H values); up(row, c): W_up[e][row][c] for row 0..2F-1 (gate rows first).
template <class Up>
MoeHiddenRef moe_hidden_ref(const std::vector<double>& x, int H, int F, Up&& up) {
  const double u8 = std::ldexp(1.0, -8), fp32 = std::ldexp(1.0, -18);
  const double gamH = H * std::ldexp(1.0, -21);
  MoeHiddenRef o;
  o.h.resize(F), o.eh.resize(F);
  for (int f = 0; f < F; ++f) {
    double g = 0, ag = 0, u = 0, au = 0;
    for (int c = 0; c < H; ++c) {
      const double pg = x[c] * up(f, c), pu = x[c] * up(F + f, c);
      g += pg, ag += std::fabs(pg), u += pu, au += std::fabs(pu);
    }
    const double eg = u8 * std::fabs(g) + (1 + u8) * gamH * ag, eu = u8 * std::fabs(u) + (1 + u8) * gamH * au;
    const double sg = g / (1 + std::exp(-g));
    o.h[f] = sg * u;
    const double D = (std::fabs(sg) + 1.1 * eg) * eu + 1.1 * std::fabs(u) * eg;
    const double q = fp32 + std::fabs(g) * std::ldexp(1.0, -22);
    o.eh[f] = (1 + u8 + q) * D + (u8 + q) * std::fabs(o.h[f]);
  }
  return o;
}

// The down projection y = Wd h of activations h with bounds eh (F values each; eh all zero when h
// is the kernel's exact bf16 input, as in the fused gemm_combine's own test); down(c, f):
// W_down[e][c][f].
template <class Down>
MoeExpertRef moe_down_ref(const std::vector<double>& h, const std::vector<double>& eh, int H, int F, Down&& down) {
  const double u8 = std::ldexp(1.0, -8), gamF = F * std::ldexp(1.0, -21);
  std::vector<double> wrow(F);
  MoeExpertRef o;
  o.y.resize(H), o.ey_det.resize(H), o.s2.resize(H);
  for (int c = 0; c < H; ++c) {
    double y = 0, a = 0, s2 = 0;
    for (int f = 0; f < F; ++f) wrow[f] = down(c, f);
    for (int f = 0; f < F; ++f) {
      y += h[f] * wrow[f];
      a += (std::fabs(h[f]) + eh[f]) * std::fabs(wrow[f]);
      s2 += eh[f] * eh[f] * wrow[f] * wrow[f];
    }
    o.y[c] = y;
    o.ey_det[c] = u8 * std::fabs(y) + (1 + u8) * gamF * a;
    o.s2[c] = s2;
  }
  return o;
}

// The whole expert: x: the token (H values); up as moe_hidden_ref, down as moe_down_ref.
template <class Up, class Down>
MoeExpertRef moe_expert_ref(const std::vector<double>& x, int H, int F, Up&& up, Down&& down) {
  const MoeHiddenRef a = moe_hidden_ref(x, H, F, up);
  return moe_down_ref(a.h, a.eh, H, F, down);
}

// One token's layer output and bound, summed over its distinct experts.
struct MoeTokenRef {
  std::vector<double> r, det, rnd2;
  explicit MoeTokenRef(int H) : r(H, 0), det(H, 0), rnd2(H, 0) {}
  // Expert output `o` with weight w, the sum of the router weights of the token's slots on it.
  void add(double w, const MoeExpertRef& o) {
    for (size_t c = 0; c < r.size(); ++c) {
      r[c] += w * o.y[c];
      det[c] += w * (o.ey_det[c] + std::ldexp(std::fabs(o.y[c]) + o.ey_det[c], -19));
      rnd2[c] += w * w * o.s2[c];
    }
  }
  double bound(int c) const {
    return 1.02 * (std::ldexp(std::fabs(r[c]), -8) + det[c] + 8 * std::sqrt(rnd2[c])) + std::ldexp(1.0, -100);
  }
};

}  // namespace weave::check
