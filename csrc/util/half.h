// IEEE half and bfloat16 conversions (round to nearest even). Torch-free.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace txla {

inline uint16_t FloatToHalfBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF);
  uint32_t mant = x & 0x7FFFFF;
  if (exp == 0xFF) return static_cast<uint16_t>(sign | 0x7C00 | (mant ? 0x200 : 0));
  int32_t e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  uint32_t lsb = (x >> 16) & 1;
  x += 0x7FFF + lsb;
  return static_cast<uint16_t>(x >> 16);
}

inline float Bf16BitsToFloat(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline float HalfBitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t x;
  if (exp == 0x1F) {
    x = sign | 0x7F800000 | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal half: normalize
      int e = -1;
      do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
    }
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// float8 from float, as eager (torch 2.13) converts: round to nearest even; e4m3fn (no infinities)
// saturates: infinities and magnitudes past 448 give +-448 (0x7E); e5m2 gives infinity (0x7C) for
// what rounds past 57344. NaN is 0x7F with the sign (-NaN is 0xFF).
inline uint8_t FloatToFloat8Bits(float f, int mant_bits, int bias, double max_finite, bool has_inf) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80);
  const uint8_t nan = 0x7F, inf = static_cast<uint8_t>((0x1F << 2));  // e5m2's infinity: 0 11111 00
  double a = std::fabs(static_cast<double>(f));
  if (std::isnan(f)) return sign | nan;
  if (!has_inf && a > max_finite) a = max_finite;  // saturate (inf included)
  if (std::isinf(f)) return sign | inf;
  if (a == 0) return sign;
  const int emin = 1 - bias;  // exponent of the smallest normal
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the exponent of a is e - 1
  const int q_exp = std::max(e - 1, emin) - mant_bits;  // the spacing of representable values near a
  double t = std::ldexp(a, -q_exp);                      // exact (a power-of-two scaling)
  double fl = std::floor(t), rem = t - fl;
  if (rem > 0.5 || (rem == 0.5 && std::fmod(fl, 2.0) == 1.0)) fl += 1;
  double r = std::ldexp(fl, q_exp);
  if (r > max_finite) return sign | inf;  // only e5m2 gets here
  if (r < std::ldexp(1.0, emin)) return sign | static_cast<uint8_t>(fl);  // subnormal (or zero)
  std::frexp(r, &e);
  const int exp_field = e - 1 + bias;
  const uint32_t mant = static_cast<uint32_t>(std::ldexp(r, -(e - 1 - mant_bits))) - (1u << mant_bits);
  return sign | static_cast<uint8_t>((exp_field << mant_bits) | mant);
}
inline uint8_t FloatToF8E4M3FNBits(float f) { return FloatToFloat8Bits(f, 3, 7, 448.0, false); }
inline uint8_t FloatToF8E5M2Bits(float f) { return FloatToFloat8Bits(f, 2, 15, 57344.0, true); }

}  // namespace txla
