// Finite-difference checks of the backward: of the f64 reference against its own forward (tight,
// central differences in f64, every feature and dropout at once), and of the library in f32
// against its own forward (loose, but independent of the reference). Also the dsink formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backward/bwd_test_support.h"
#include "reference/reference_bwd.h"

namespace anyattn {
namespace testing {
namespace {

// A tiny sequence with every feature on, held in f64 arrays that the test perturbs.
struct TinySequence {
  int64_t Sq = 4, Sk = 6, Hq = 2, Hk = 1, D = 3, Dv = 2;
  std::vector<double> q, k, v, dout, alibi, sinks;

  TinySequence() {
    auto fill = [](std::vector<double>* x, int64_t n, double phase) {
      x->resize(static_cast<size_t>(n));
      for (int64_t e = 0; e < n; ++e) (*x)[e] = std::sin(1.7 * e + phase) * 1.3;
    };
    fill(&q, Sq * Hq * D, 0.1);
    fill(&k, Sk * Hk * D, 0.7);
    fill(&v, Sk * Hk * Dv, 1.9);
    fill(&dout, Sq * Hq * Dv, 2.3);
    alibi = {0.25, 0.5};
    sinks = {0.3, -0.8};
  }
  reference::SequenceInputs inputs() const {
    reference::SequenceInputs in;
    in.seqlen_q = Sq;
    in.seqlen_k = Sk;
    in.num_heads_q = Hq;
    in.num_heads_k = Hk;
    in.head_dim = D;
    in.head_dim_v = Dv;
    in.q = q.data();
    in.k = k.data();
    in.v = v.data();
    in.alibi_slopes = alibi.data();
    in.sinks = sinks.data();
    return in;
  }
};

double loss(const reference::SequenceGradients& g, const std::vector<double>& dout) {
  double sum = 0.0;
  for (size_t e = 0; e < dout.size(); ++e) sum += g.out[e] * dout[e];
  return sum;
}

TEST(BwdFiniteDifference, ReferenceGradientsMatchCentralDifferences) {
  TinySequence seq;
  reference::ScoreOptions options;
  options.softmax_scale = 0.9;
  options.softcap = 2.0;
  options.window_left = 3;
  options.window_right = 1;
  for (double p : {0.0, 0.4}) {
    reference::DropoutOptions dropout;
    dropout.p = p;
    dropout.seed = 1234;
    dropout.offset = 5;
    const reference::SequenceGradients g =
        reference::backprop_one_sequence(seq.inputs(), seq.dout.data(), options, dropout, 1);
    struct Target {
      const char* name;
      std::vector<double>* values;
      const std::vector<double>* grad;
    };
    const Target targets[] = {{"q", &seq.q, &g.dq},
                              {"k", &seq.k, &g.dk},
                              {"v", &seq.v, &g.dv},
                              {"sinks", &seq.sinks, &g.dsinks}};
    const double h = 1e-6;
    double largest = 0.0;
    for (const Target& t : targets) {
      for (size_t e = 0; e < t.values->size(); ++e) {
        const double saved = (*t.values)[e];
        (*t.values)[e] = saved + h;
        const double plus = loss(
            reference::backprop_one_sequence(seq.inputs(), seq.dout.data(), options, dropout, 1),
            seq.dout);
        (*t.values)[e] = saved - h;
        const double minus = loss(
            reference::backprop_one_sequence(seq.inputs(), seq.dout.data(), options, dropout, 1),
            seq.dout);
        (*t.values)[e] = saved;
        const double fd = (plus - minus) / (2 * h);
        const double analytic = (*t.grad)[e];
        largest = std::max(largest, std::fabs(analytic));
        EXPECT_NEAR(analytic, fd, 1e-7 * std::max(1.0, std::fabs(fd)))
            << t.name << "[" << e << "] dropout=" << p;
      }
    }
    EXPECT_GT(largest, 0.05) << "the gradients are too small for the check to mean anything";
  }
}

// dsink_h = -sum_i exp(sink_h - lse_i) * rowsum(dout_i * out_i), checked against that closed form
// evaluated from the reference's own out and lse.
TEST(BwdFiniteDifference, DsinkEqualsClosedForm) {
  TinySequence seq;
  reference::ScoreOptions options;
  options.softmax_scale = 0.7;
  const reference::SequenceGradients g = reference::backprop_one_sequence(
      seq.inputs(), seq.dout.data(), options, reference::DropoutOptions{}, 0);
  for (int64_t h = 0; h < seq.Hq; ++h) {
    double expected = 0.0;
    for (int64_t i = 0; i < seq.Sq; ++i) {
      double delta = 0.0;
      for (int64_t c = 0; c < seq.Dv; ++c) {
        delta += seq.dout[(i * seq.Hq + h) * seq.Dv + c] * g.out[(i * seq.Hq + h) * seq.Dv + c];
      }
      expected -= std::exp(seq.sinks[h] - g.lse[h * seq.Sq + i]) * delta;
    }
    EXPECT_NEAR(g.dsinks[h], expected, 1e-12) << "head " << h;
    EXPECT_GT(std::fabs(expected), 1e-3);
  }
}

// The library in f32: gradients from anyattn_bwd against central differences of
// L = sum(dout * out) with out from anyattn_fwd.
TEST(BwdFiniteDifference, LibraryF32GradientsMatchDifferencesOfItsForward) {
  BwdCase c;
  c.fwd.B = 1;
  c.fwd.Sq = 5;
  c.fwd.Sk = 7;
  c.fwd.Hq = 2;
  c.fwd.Hk = 1;
  c.fwd.D = 4;
  c.fwd.Dv = 3;
  c.fwd.causal = true;
  c.fwd.softcap = 2.5f;
  c.fwd.alibi = Alibi::kPerHead;
  c.fwd.sinks = true;
  c.fwd.seed = 11;
  BwdProblem p(c);
  ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  const Gradients grads = p.gradients();
  const std::vector<double> dout = reference::to_contiguous_f64(p.dout);
  auto library_loss = [&]() {
    EXPECT_EQ(p.fwd.run(), ANYATTN_OK);
    const std::vector<double> out = p.fwd.out_values();
    double sum = 0.0;
    for (size_t e = 0; e < out.size(); ++e) sum += out[e] * dout[e];
    return sum;
  };
  const double h = 1e-2;
  double largest = 0.0, worst = 0.0;
  auto check = [&](const char* name, float* value, double analytic) {
    const float saved = *value;
    *value = saved + static_cast<float>(h);
    const double actual_plus = *value;
    const double plus = library_loss();
    *value = saved - static_cast<float>(h);
    const double actual_minus = *value;
    const double minus = library_loss();
    *value = saved;
    const double fd = (plus - minus) / (actual_plus - actual_minus);
    largest = std::max(largest, std::fabs(analytic));
    worst = std::max(worst, std::fabs(fd - analytic));
    EXPECT_NEAR(analytic, fd, 2e-3) << name;
  };
  for (auto [tensor, grad, name] :
       {std::tuple{&p.fwd.q, &grads.dq, "q"}, std::tuple{&p.fwd.k, &grads.dk, "k"},
        std::tuple{&p.fwd.v, &grads.dv, "v"}}) {
    float* data = static_cast<float*>(tensor->data);
    for (size_t e = 0; e < grad->size(); ++e) check(name, data + e, (*grad)[e]);
  }
  for (int64_t hq = 0; hq < c.fwd.Hq; ++hq) {
    check("sinks", &p.fwd.sinks_buffer[hq], grads.dsinks[hq]);
  }
  EXPECT_GT(largest, 0.05);
  EXPECT_LT(worst, 2e-3);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
