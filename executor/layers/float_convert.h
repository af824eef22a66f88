// Conversions between float and the dtypes specexec's C++ CPU ops take, written so that GCC vectorizes
// the loops they sit in. c10::BFloat16's own conversion (a call with a NaN branch per element) keeps a
// loop scalar; here bfloat16 is its bits: widening is a shift, narrowing rounds to nearest-even in
// integer arithmetic and maps NaN to c10's 0x7FC0, so every result equals c10's bit for bit. float16 and
// double keep c10's and C++'s conversions.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace specexec_convert {

inline float bits_to_float(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

inline uint32_t float_to_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// x rounded to bfloat16 (nearest, ties to even; NaN to c10's quiet NaN), as its 16 bits
inline uint16_t bf16_bits(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(x != x ? 0x7FC0u : rounded);
}

inline float bf16_float(uint16_t bits) { return bits_to_float(static_cast<uint32_t>(bits) << 16); }

// A value of T as float, and a float stored as T (rounded as static_cast<T> rounds)
template <typename T>
inline float widen(const T* p) {
  return static_cast<float>(*p);
}
template <>
inline float widen<c10::BFloat16>(const c10::BFloat16* p) {
  return bf16_float(p->x);
}

template <typename T>
inline void put(T* p, float x) {
  *p = static_cast<T>(x);
}
template <>
inline void put<c10::BFloat16>(c10::BFloat16* p, float x) {
  p->x = bf16_bits(x);
}

// x rounded to T and back: what a torch op computing in float and returning T leaves
template <typename T>
inline float round_to(float x) {
  return static_cast<float>(static_cast<T>(x));
}
template <>
inline float round_to<float>(float x) {
  return x;
}
template <>
inline float round_to<c10::BFloat16>(float x) {
  return bf16_float(bf16_bits(x));
}

}  // namespace specexec_convert
