// ShardBox: plain boxes and the packed ones of tensor parallelism over packed layers (every part
// split on its own): their pieces, FSDP's row blocks of them, and cutting them out of the whole.
#include "titan/common/shard_box.h"

#include <gtest/gtest.h>

namespace titan {
namespace {

using BoxRun = ShardBox::Run;

// q, k, v rows of 4 each and an MLP part of 8, (20, 3), split over 2: slice 1 of every part.
ShardBox qkv_mlp_slice1() { return ShardBox::packed_slice({20, 3}, 0, {4, 4, 4, 8}, 1, 2); }

TEST(ShardBox, PackedSliceTakesTheSameSliceOfEveryPart) {
  const ShardBox box = qkv_mlp_slice1();
  ASSERT_TRUE(box.packed());
  EXPECT_EQ(box.packed_dim, 0);
  EXPECT_EQ(box.runs, (std::vector<BoxRun>{{0, 2, 2}, {2, 6, 2}, {4, 10, 2}, {6, 16, 4}}));
  const std::vector<ShardPiece> pieces = box.pieces();
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[3].box.offsets, (std::vector<int64_t>{16, 0}));
  EXPECT_FALSE(pieces[3].box.packed());
  EXPECT_EQ(pieces[3].local_start, 6);
  EXPECT_EQ(pieces[3].length, 4);

  // Cut out of the whole: rows 2-3, 6-7, 10-11, 16-19.
  const at::Tensor whole = at::arange(60, at::kFloat).view({20, 3});
  const at::Tensor local = box.narrow(whole, {10, 3});
  const at::Tensor rows = at::tensor(std::vector<int64_t>{2, 3, 6, 7, 10, 11, 16, 17, 18, 19});
  EXPECT_TRUE(at::equal(local, whole.index_select(0, rows)));
  for (const ShardPiece& p : pieces) {
    EXPECT_TRUE(at::equal(p.of(local), p.box.narrow(whole, p.of(local).sizes())));
  }
}

TEST(ShardBox, OnePartOrContinuingRunsArePlain) {
  const ShardBox one = ShardBox::packed_slice({8, 3}, 0, {8}, 1, 2);
  EXPECT_FALSE(one.packed());
  EXPECT_EQ(one.offsets, (std::vector<int64_t>{4, 0}));
  // Slice 0 of 1: every part whole, one run.
  const ShardBox all = ShardBox::packed_slice({20, 3}, 0, {4, 4, 4, 8}, 0, 1);
  EXPECT_FALSE(all.packed());
  EXPECT_EQ(all.offsets, (std::vector<int64_t>{0, 0}));
  // Columns packed: [attention 4 | MLP 8] of (3, 12), slice 0 of 2.
  const ShardBox cols = ShardBox::packed_slice({3, 12}, 1, {4, 8}, 0, 2);
  ASSERT_TRUE(cols.packed());
  EXPECT_EQ(cols.runs, (std::vector<BoxRun>{{0, 0, 2}, {2, 4, 4}}));
  EXPECT_THROW(ShardBox::packed_slice({3, 12}, 1, {4, 7}, 0, 2), std::exception);
}

TEST(ShardBox, RowBlocksOfAPackedBoxKeepTheirRuns) {
  const ShardBox box = qkv_mlp_slice1();
  // Local rows 1..4: the end of q's run, all of k's, the start of v's.
  const ShardBox block = box.rows(1, 4);
  ASSERT_TRUE(block.packed());
  EXPECT_EQ(block.runs, (std::vector<BoxRun>{{0, 3, 1}, {1, 6, 2}, {3, 10, 1}}));
  // Inside one run: plain.
  const ShardBox inside = box.rows(7, 2);
  EXPECT_FALSE(inside.packed());
  EXPECT_EQ(inside.offsets, (std::vector<int64_t>{17, 0}));
  // No rows: plain and empty.
  EXPECT_FALSE(box.rows(10, 0).packed());
  // Packed columns: a row block moves the rows only.
  const ShardBox cols = ShardBox::packed_slice({3, 12}, 1, {4, 8}, 1, 2).rows(1, 2);
  ASSERT_TRUE(cols.packed());
  EXPECT_EQ(cols.offsets[0], 1);
  const at::Tensor whole = at::arange(36, at::kFloat).view({3, 12});
  const at::Tensor want = at::cat({whole.slice(1, 2, 4), whole.slice(1, 8, 12)}, 1).slice(0, 1, 3);
  EXPECT_TRUE(at::equal(cols.narrow(whole, {2, 6}), want));
  // A plain box's row block.
  EXPECT_EQ(ShardBox::whole({6, 2}).rows(3, 3).offsets, (std::vector<int64_t>{3, 0}));
}

}  // namespace
}  // namespace titan
