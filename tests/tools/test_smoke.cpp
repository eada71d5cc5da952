#include <gtest/gtest.h>

#include "tests/support/test_env.h"

TEST(Cli, PrintsVersion) {
    auto r = gj::test::run_command(gj::test::gemmajit_exe() + " --version");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("gemmajit"), std::string::npos) << r.out;
}
