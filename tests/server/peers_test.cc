// peers_test.cc — PeerTable (server/peers.h): a worker's connections are kept up to the bound and
// the oldest is forgotten with its region; a connection registering as another id moves to it; a
// repeated register is not new; readers are bounded apart from workers.
#include "server/peers.h"

#include <gtest/gtest.h>

#include <string>

namespace downpour {
namespace {

PeerId Peer(int i) { return "peer-" + std::to_string(i); }

TEST(PeerTable, AWorkersConnectionsAreBoundedAndTheOldestGoesWithItsRegion) {
  PeerTable t(/*max_workers=*/2);
  for (int i = 0; i < PeerTable::kPeersPerWorker; ++i) EXPECT_TRUE(t.RegisterWorker(Peer(i), 1));
  std::unique_ptr<SharedRegion> region;
  ASSERT_TRUE(SharedRegion::Create("downpour-peers-test", 4096, &region).ok());
  t.SetRegion(Peer(0), std::move(region));
  EXPECT_NE(t.Region(Peer(0)), nullptr);
  EXPECT_FALSE(t.RegisterWorker(Peer(0), 1));  // the same again: nothing new
  for (int i = 0; i < PeerTable::kPeersPerWorker; ++i) EXPECT_TRUE(t.IsWorker(Peer(i), 1)) << i;
  EXPECT_TRUE(t.RegisterWorker(Peer(100), 1));  // one past the bound: peer 0 is forgotten
  EXPECT_FALSE(t.IsWorker(Peer(0), 1));
  EXPECT_EQ(t.Region(Peer(0)), nullptr);
  EXPECT_TRUE(t.IsWorker(Peer(100), 1));
  EXPECT_EQ(t.workers_kept(), static_cast<size_t>(PeerTable::kPeersPerWorker));
  EXPECT_GE(PeerTable::kPeersPerWorker, 2 * kMaxConnectionsPerServer);  // room for every connection, twice
}

TEST(PeerTable, AConnectionRegisteringAsAnotherIdMovesToIt) {
  PeerTable t(2);
  EXPECT_TRUE(t.RegisterWorker(Peer(1), 0));
  EXPECT_TRUE(t.RegisterWorker(Peer(1), 1));
  EXPECT_FALSE(t.IsWorker(Peer(1), 0));
  EXPECT_TRUE(t.IsWorker(Peer(1), 1));
  // Worker 0's bound no longer counts it: a full set of new connections all stay.
  for (int i = 10; i < 10 + PeerTable::kPeersPerWorker; ++i) EXPECT_TRUE(t.RegisterWorker(Peer(i), 0));
  for (int i = 10; i < 10 + PeerTable::kPeersPerWorker; ++i) EXPECT_TRUE(t.IsWorker(Peer(i), 0));
  EXPECT_TRUE(t.IsWorker(Peer(1), 1));
}

TEST(PeerTable, ReadersAreBoundedAndAreNotWorkers) {
  PeerTable t(1);
  for (int i = 0; i < PeerTable::kMaxReaders; ++i) EXPECT_TRUE(t.RegisterReader(Peer(i)));
  EXPECT_FALSE(t.RegisterReader(Peer(0)));
  EXPECT_TRUE(t.RegisterReader(Peer(50)));  // past the bound: the oldest goes
  EXPECT_FALSE(t.IsReader(Peer(0)));
  EXPECT_TRUE(t.IsReader(Peer(50)));
  EXPECT_FALSE(t.IsWorker(Peer(50), 0));
}

}  // namespace
}  // namespace downpour
