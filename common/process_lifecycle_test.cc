#include "common/process_lifecycle.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(PortFileTest, RoundTrip) {
  const std::string path = TempPath("port_roundtrip");
  ASSERT_TRUE(WritePortFile(path, 43210).ok());
  auto port = ReadPortFile(path, absl::Seconds(1));
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, 43210);
}

TEST(PortFileTest, WaitsForTheFileThenTimesOut) {
  const std::string path = TempPath("port_late");
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    (void)WritePortFile(path, 1234);
  });
  auto port = ReadPortFile(path, absl::Seconds(5));
  writer.join();
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, 1234);
  auto missing = ReadPortFile(TempPath("never_written"), absl::Milliseconds(50));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(PortFileTest, GarbageIsInvalidArgument) {
  const std::string path = TempPath("port_garbage");
  std::ofstream(path) << "not a port\n";
  EXPECT_EQ(ReadPortFile(path, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShutdownSignalTest, SigtermAndRequestShutdownWake) {
  InstallShutdownSignalHandlers();
  std::thread t([] { kill(getpid(), SIGTERM); });
  EXPECT_EQ(WaitForShutdownSignal(), SIGTERM);
  t.join();
  std::thread r([] { RequestShutdown(); });
  EXPECT_EQ(WaitForShutdownSignal(), 0);
  r.join();
}

}  // namespace
}  // namespace deepinfer
