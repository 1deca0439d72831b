// Element conversion between floating dtypes for `consolidate --dtype`: through float32, with
// round-to-nearest-even into bfloat16 and float16 (NaN stays NaN, with the bits torch 2.x's
// vectorized x86 conversion gives it; overflow becomes infinity).
#pragma once

#include <cstddef>

#include "shardckpt/engine/model/dtype.h"

namespace shardckpt {

bool IsFloatingDType(DType dtype);  // float64, float32, float16, bfloat16 (not float8)
void ConvertFloats(DType from, DType to, const void* in, void* out, size_t count);

}  // namespace shardckpt
