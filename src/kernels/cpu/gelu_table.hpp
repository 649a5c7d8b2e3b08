// Internal (host kernels): the exact (erf) GELU and its derivative as
// piecewise quintics in |x|, shared by the AVX-512 kernels (gelu_avx512.cpp)
// and the portable loops (activation.cpp), which evaluate the same
// polynomials in the same order with fused multiply-adds, so both give the
// same f32 bits.
//
// NOTE [gelu tables] With a = |x|, Phi the normal CDF and phi its density:
//   gelu(x)  = x Phi(x)          = (x >= 0 ? a - g(a) : -g(a)),  g(a) = a Phi(-a)
//   gelu'(x) = Phi(x) + x phi(x) = (x >= 0 ? 1 - d(a) : d(a)),   d(a) = Phi(-a) - a phi(a)
// g and d are smooth, bounded, and fall to zero like phi, so neither needs an
// erf, an exp or a division: a is clamped to [0, 7.75], rounded to the nearest
// multiple of 1/4 (n = 0..31; the table index), and each function is a quintic
// in r = a - n/4 (|r| <= 1/8) with coefficients per n. Piece 31 (a >= 7.625)
// is zero: |g|, |d| < 1e-12 there, below f32's resolution of every result but
// the far negative tail, which becomes -0 (gelu) and 0 (gelu') instead of
// values under 1e-12. The sign comes from x, so gelu(-0) = -0 and gelu(-inf) = -0,
// gelu(+inf) = inf, gelu'(+-inf) = 1 and 0; NaN propagates.
//
// The coefficients are least-squares fits on 60 Chebyshev points of each piece
// (40-digit mpmath erfc), rounded to f32 one at a time from the constant term
// up, the higher ones refitted after each rounding; piece 0 is fitted on
// [0, 1/8] with g's constant term 0 and linear term 1/2 and d's constant term
// 1/2 fixed, so gelu(x) = x/2 and gelu'(x) = 1/2 to the last bit for tiny x.
// Fit error (coefficients rounded): at most 5.4e-9 (g) and 5.1e-9 (d)
// absolute, 1.4e-5 relative for a < 6.5 (tools/gelu_table_fit.py prints the
// tables and these errors). tests/kernels/activation_test.cpp
// checks the kernels' f32 results against double erf (docs/kernels.md).
#pragma once

#include <cmath>
#include <cstdint>

namespace loom::kernels::cpu {

inline constexpr int kGeluDegree = 5;
inline constexpr int kGeluPieces = 32;
inline constexpr float kGeluStep = 0.25f;   // piece width
inline constexpr float kGeluClamp = 7.75f;  // centre of the last (zero) piece

// Rows from r^5 down to r^0; columns are the pieces (generated, see above).
// clang-format off
inline constexpr float kGeluForwardTable[kGeluDegree + 1][kGeluPieces] = {
    {  // r^5, pieces 0 to 31
        -0.0033957316f, -0.013912393f, -0.022339333f, -0.022751918f,
        -0.016090175f, -0.00620162f, 0.0026531008f, 0.007897493f,
        0.0089510605f, 0.0071639344f, 0.004271191f, 0.001676469f,
        8.66602e-06f, -0.0007269964f, -0.0008444937f, -0.0006721568f,
        -0.00043747257f, -0.00024678663f, -0.0001236777f, -5.588347e-05f,
        -2.2984543e-05f, -8.6564005e-06f, -2.9985297e-06f, -9.583156e-07f,
        -2.8328546e-07f, -7.7616285e-08f, -1.9740073e-08f, -4.666396e-09f,
        -1.0264248e-09f, -2.1026635e-10f, -4.0148888e-11f, 0.0f,
    },
    {  // r^4, pieces 0 to 31
        0.06690515f, 0.057254765f, 0.033883754f, 0.004782295f,
        -0.020004736f, -0.034142062f, -0.035997704f, -0.028904473f,
        -0.018011037f, -0.0077327415f, -0.0005498916f, 0.0030940515f,
        0.0040464797f, 0.003514177f, 0.0024850836f, 0.001521453f,
        0.0008287828f, 0.0004077058f, 0.00018280528f, 7.515409e-05f,
        2.8457314e-05f, 9.955332e-06f, 3.2253004e-06f, 9.695469e-07f,
        2.7083976e-07f, 7.0393334e-08f, 1.7040165e-08f, 3.8451375e-09f,
        8.0940515e-10f, 1.59041e-10f, 2.918603e-11f, 0.0f,
    },
    {  // r^3, pieces 0 to 31
        -2.1224494e-05f, 0.06343776f, 0.11001896f, 0.1293944f,
        0.12098494f, 0.092751555f, 0.0566651f, 0.023591703f,
        6.094909e-07f, -0.012646151f, -0.016432798f, -0.01484816f,
        -0.011079671f, -0.0072127203f, -0.0041998196f, -0.0022175044f,
        -0.0010706428f, -0.0004753158f, -0.00019479656f, -7.390728e-05f,
        -2.6016105e-05f, -8.511073e-06f, -2.5911957e-06f, -7.349678e-07f,
        -1.9439386e-07f, -4.798118e-08f, -1.1058933e-08f, -2.3814837e-09f,
        -4.793793e-10f, -9.0237616e-11f, -1.589014e-11f, 0.0f,
    },
    {  // r^2, pieces 0 to 31
        -0.3989419f, -0.3745833f, -0.30805737f, -0.2164423f,
        -0.12098654f, -0.039953806f, 0.016189469f, 0.0458342f,
        0.053991098f, 0.048601773f, 0.03724795f, 0.025291657f,
        0.015511534f, 0.008686887f, 0.0044724937f, 0.0021265722f,
        0.0009367908f, 0.00038322568f, 0.00014584299f, 5.1705352e-05f,
        1.7095326e-05f, 5.275897e-06f, 1.5209276e-06f, 4.0980441e-07f,
        1.03257534e-07f, 2.4340672e-08f, 5.3699547e-09f, 1.1091135e-09f,
        2.1452132e-10f, 3.886521e-11f, 6.596936e-12f, 0.0f,
    },
    {  // r^1, pieces 0 to 31
        0.5f, 0.30462664f, 0.13250488f, 0.0007742794f,
        -0.08331547f, -0.12266158f, -0.1274692f, -0.11092615f,
        -0.0852318f, -0.059189744f, -0.037611086f, -0.022027534f,
        -0.011945647f, -0.006017381f, -0.0028217603f, -0.0012338165f,
        -0.00050364964f, -0.0001921157f, -6.8529174e-05f, -2.2873082e-05f,
        -7.146949e-06f, -2.091399e-06f, -5.733478e-07f, -1.4729451e-07f,
        -3.5468776e-08f, -8.007306e-09f, -1.6950578e-09f, -3.3651762e-10f,
        -6.266361e-11f, -1.0946099e-11f, -1.7938491e-12f, 0.0f,
    },
    {  // r^0, pieces 0 to 31
        0.0f, 0.10032342f, 0.15426877f, 0.16997051f,
        0.15865526f, 0.13206221f, 0.1002108f, 0.070103526f,
        0.045500264f, 0.027505063f, 0.015524163f, 0.008194349f,
        0.004049694f, 0.0018753314f, 0.0008142018f, 0.00033156484f,
        0.00012668499f, 4.5426248e-05f, 1.5289537e-05f, 4.831149e-06f,
        1.4332595e-06f, 3.9926113e-07f, 1.04442854e-07f, 2.5657581e-08f,
        5.919554e-09f, 1.2826729e-09f, 2.6104224e-10f, 4.9898287e-11f,
        8.958814e-12f, 1.5108241e-12f, 2.3932223e-13f, 0.0f,
    },
};

inline constexpr float kGeluBackwardTable[kGeluDegree + 1][kGeluPieces] = {
    {  // r^5, pieces 0 to 31
        -0.059958287f, -0.047695912f, -0.018229503f, 0.014531497f,
        0.03605172f, 0.040109143f, 0.029213155f, 0.012115585f,
        -0.0026144944f, -0.010506991f, -0.011653703f, -0.008694025f,
        -0.004670657f, -0.001467498f, 0.00030900823f, 0.00092232914f,
        0.00088767783f, 0.0006266464f, 0.0003682729f, 0.00018829369f,
        8.5792e-05f, 3.5280034e-05f, 1.3203462e-05f, 4.5231977e-06f,
        1.4243838e-06f, 4.135824e-07f, 1.11006564e-07f, 2.7596784e-08f,
        6.3638486e-09f, 1.3631161e-09f, 2.715226e-10f, 0.0f,
    },
    {  // r^4, pieces 0 to 31
        0.00015415093f, -0.06943492f, -0.11175178f, -0.11368468f,
        -0.08044891f, -0.03102233f, 0.013370255f, 0.039435603f,
        0.04479214f, 0.03581625f, 0.021361269f, 0.00839124f,
        5.5759916e-05f, -0.0036360063f, -0.004222003f, -0.0033610333f,
        -0.0021894071f, -0.0012345798f, -0.0006188259f, -0.00027975783f,
        -0.000115104f, -4.336826e-05f, -1.502716e-05f, -4.804569e-06f,
        -1.4208725e-06f, -3.8945723e-07f, -9.9088986e-08f, -2.3434062e-08f,
        -5.156835e-09f, -1.0569088e-09f, -2.0190484e-10f, 0.0f,
    },
    {  // r^3, pieces 0 to 31
        0.2659372f, 0.22983351f, 0.13569097f, 0.01901609f,
        -0.0806543f, -0.13686723f, -0.14435731f, -0.11587863f,
        -0.07198875f, -0.030728431f, -0.002008897f, 0.01250948f,
        0.016250346f, 0.014077932f, 0.009935926f, 0.0060715307f,
        0.0033011653f, 0.0016209779f, 0.0007254199f, 0.0002976813f,
        0.00011249111f, 3.927014e-05f, 1.269495e-05f, 3.8075282e-06f,
        1.0610978e-06f, 2.7510922e-07f, 6.642565e-08f, 1.4949265e-08f,
        3.1381728e-09f, 6.148628e-10f, 1.1250147e-10f, 0.0f,
    },
    {  // r^2, pieces 0 to 31
        1.3264294e-06f, 0.19031197f, 0.33005753f, 0.3881823f,
        0.36295483f, 0.2782548f, 0.16999416f, 0.07077563f,
        1.4155906e-06f, -0.037938423f, -0.049298447f, -0.044544566f,
        -0.033239137f, -0.021638146f, -0.012599462f, -0.0066525103f,
        -0.0032119004f, -0.0014259394f, -0.0005843846f, -0.00022171783f,
        -7.80462e-05f, -2.5532203e-05f, -7.773185e-06f, -2.2047511e-06f,
        -5.831295e-07f, -1.4392738e-07f, -3.3172253e-08f, -7.1432553e-09f,
        -1.4378487e-09f, -2.706475e-10f, -4.7656826e-11f, 0.0f,
    },
    {  // r^1, pieces 0 to 31
        -0.7978846f, -0.74916947f, -0.6161143f, -0.43288505f,
        -0.24197073f, -0.079908974f, 0.032379396f, 0.09166965f,
        0.107981935f, 0.09720269f, 0.07449528f, 0.05058294f,
        0.031022938f, 0.017373724f, 0.008944998f, 0.0042531854f,
        0.0018736231f, 0.0007664806f, 0.0002917033f, 0.000103419254f,
        3.4194556e-05f, 1.0553408e-05f, 3.0424592e-06f, 8.1981574e-07f,
        2.0658032e-07f, 4.8700294e-08f, 1.0744996e-08f, 2.219491e-09f,
        4.2933407e-10f, 7.779284e-11f, 1.3206302e-11f, 0.0f,
    },
    {  // r^0, pieces 0 to 31
        0.5f, 0.30462664f, 0.13250488f, 0.0007742806f,
        -0.08331547f, -0.12266158f, -0.1274692f, -0.11092615f,
        -0.0852318f, -0.059189744f, -0.037611086f, -0.022027534f,
        -0.011945647f, -0.006017381f, -0.0028217603f, -0.0012338165f,
        -0.0005036497f, -0.00019211571f, -6.852918e-05f, -2.2873088e-05f,
        -7.1469517e-06f, -2.0914003e-06f, -5.733483e-07f, -1.4729471e-07f,
        -3.5468844e-08f, -8.007327e-09f, -1.6950636e-09f, -3.3651917e-10f,
        -6.2663985e-11f, -1.0946184e-11f, -1.7938668e-12f, 0.0f,
    },
};
// clang-format on

// The piecewise polynomial at a = min(|x|, kGeluClamp) (not NaN).
inline float gelu_piece(const float (&table)[kGeluDegree + 1][kGeluPieces], float a) {
  const float n = std::nearbyint(a * (1.0f / kGeluStep));  // to nearest even, as the kernels
  const int piece = static_cast<int>(n);
  const float r = a - n * kGeluStep;  // exact
  float p = table[0][piece];
  for (int k = 1; k <= kGeluDegree; ++k) p = std::fma(p, r, table[k][piece]);
  return p;
}

// gelu(x) for one value, as the AVX-512 kernel computes it.
inline float gelu_value(float x) {
  if (std::isnan(x)) return x + x;
  const float a = std::fabs(x);
  const float g = gelu_piece(kGeluForwardTable, std::fmin(a, kGeluClamp));
  return std::copysign(std::signbit(x) ? g : a - g, x);
}

// gelu'(x) for one value, as the AVX-512 kernel computes it.
inline float gelu_derivative_value(float x) {
  if (std::isnan(x)) return x + x;
  const float d = gelu_piece(kGeluBackwardTable, std::fmin(std::fabs(x), kGeluClamp));
  return std::signbit(x) ? d : 1.0f - d;
}

}  // namespace loom::kernels::cpu
