// The library's one error type: what a caller sees when it takes a Result's value unchecked.
#include "shardckpt/io/status.h"

#include <gtest/gtest.h>

#include <string>

namespace shardckpt {
namespace {

Result<int> Refused() { return FailedPrecondition("needs MPI_THREAD_MULTIPLE"); }

TEST(Result, ValueOfAnErrorSaysTheErrorAndAborts) {
  EXPECT_EQ(Result<int>(7).value(), 7);
  // The README's `Create(...).value()` ended in "std::get: wrong index for variant".
  EXPECT_DEATH((void)Refused().value(), "value\\(\\) of a Result that holds an error: FailedPrecondition: needs MPI_THREAD_MULTIPLE");
  const Result<std::string> held = Status(Code::kNotFound, "ck/step-000000010 does not exist");
  EXPECT_DEATH((void)held.value(), "NotFound: ck/step-000000010 does not exist");
  EXPECT_DEATH((void)*Refused(), "needs MPI_THREAD_MULTIPLE");
}

}  // namespace
}  // namespace shardckpt
