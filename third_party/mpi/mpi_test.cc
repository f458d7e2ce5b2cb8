// Proves OpenMPI links and its library answers (MPI_Get_library_version may
// be called before MPI_Init, so no launcher is needed here).
#include <mpi.h>

#include <string>

#include "gtest/gtest.h"

namespace {

TEST(MpiTest, ReportsOpenMpiVersion) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  ASSERT_EQ(MPI_Get_library_version(version, &length), MPI_SUCCESS);
  std::string text(version, length);
  EXPECT_NE(text.find("Open MPI"), std::string::npos) << text;
  int initialized = 1;
  ASSERT_EQ(MPI_Initialized(&initialized), MPI_SUCCESS);
  EXPECT_EQ(initialized, 0);
}

}  // namespace
