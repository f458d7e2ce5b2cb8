// Proves Gloo links and runs a ring all-reduce between two in-process ranks
// over its TCP transport on loopback.
#include <memory>
#include <thread>
#include <vector>

#include "gloo/allreduce_ring.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"
#include "gtest/gtest.h"

namespace {

TEST(GlooTest, RingAllreduceBetweenTwoThreads) {
  constexpr int kWorld = 2;
  gloo::rendezvous::HashStore store;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  std::vector<std::vector<float>> data(kWorld);
  // The contexts outlive both threads: a rank that finished first and closed
  // its connections could fail the other's last receive.
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts(kWorld);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    data[rank] = {1.0f * (rank + 1), 10.0f * (rank + 1), -1.0f};
    contexts[rank] = std::make_shared<gloo::rendezvous::Context>(rank, kWorld);
    ranks.emplace_back([&, rank] {
      const std::shared_ptr<gloo::rendezvous::Context>& context = contexts[rank];
      context->setTimeout(std::chrono::seconds(30));
      context->connectFullMesh(store, device);
      std::vector<float*> ptrs = {data[rank].data()};
      gloo::AllreduceRing<float> allreduce(context, ptrs, data[rank].size());
      allreduce.run();
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_FLOAT_EQ(data[rank][0], 3.0f);
    EXPECT_FLOAT_EQ(data[rank][1], 30.0f);
    EXPECT_FLOAT_EQ(data[rank][2], -2.0f);
  }
}

}  // namespace
