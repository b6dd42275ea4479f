#pragma once
// Physical units as types, so that joules, watts and seconds are never confused where a
// number crosses an API. Only the operations that make physical sense are defined.

#include <compare>

namespace joule {

struct Seconds {
  double value = 0.0;
  auto operator<=>(const Seconds&) const = default;
};

struct Joules {
  double value = 0.0;
  auto operator<=>(const Joules&) const = default;
  Joules& operator+=(Joules other) {
    value += other.value;
    return *this;
  }
};

struct Watts {
  double value = 0.0;
  auto operator<=>(const Watts&) const = default;
};

inline Joules operator+(Joules a, Joules b) { return Joules{a.value + b.value}; }
inline Joules operator-(Joules a, Joules b) { return Joules{a.value - b.value}; }
inline Joules operator*(Watts p, Seconds t) { return Joules{p.value * t.value}; }
/// Mean power over an interval; zero for an empty interval rather than a division by zero.
inline Watts operator/(Joules e, Seconds t) { return Watts{t.value > 0.0 ? e.value / t.value : 0.0}; }

}  // namespace joule
