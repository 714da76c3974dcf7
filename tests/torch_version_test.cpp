// The torch a front end runs with is the torch it was built against, checked at its start,
// and both front ends say their version (mixtrain --version, mixtrain.__version__).
#include "cli_util.h"

#include <mixtrain/compat.h>

using namespace mixtrain::test;

namespace {

TEST(TorchVersionTest, TheVersionIsReadFromTorchsVersionFile) {
  using mixtrain::compat::torch_version_in;
  EXPECT_EQ(torch_version_in("from typing import Optional\n__version__ = '2.13.0+cpu'\ndebug = False\n"), "2.13.0");
  EXPECT_EQ(torch_version_in("__version__ = \"2.14.1+cu130\"\n"), "2.14.1");
  EXPECT_EQ(torch_version_in("version = '2.13.0'\n"), "");
  EXPECT_EQ(torch_version_in(""), "");
}

// The suite runs against the torch it was built with: the check finds the wheel's
// version.py beside the loaded libc10 and agrees.
TEST(TorchVersionTest, TheLoadedTorchIsTheBuiltOne) {
  std::string where;
  const std::string loaded = mixtrain::compat::loaded_torch_version(&where);
  ASSERT_FALSE(loaded.empty()) << "no version.py beside the loaded libc10 (a pip torch has one)";
  EXPECT_EQ(loaded, mixtrain::compat::built_torch_version()) << where;
  EXPECT_EQ(mixtrain::compat::torch_mismatch(), "");
}

TEST(TorchVersionTest, TheCliSaysItsVersionAndItsTorch) {
  const CliResult r = run_cli("--version");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("mixtrain 0.", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("built against torch " + mixtrain::compat::built_torch_version()), std::string::npos) << r.out;
}

} // namespace
