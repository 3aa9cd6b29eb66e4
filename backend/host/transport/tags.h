// The host path's 64-bit message tags (docs/design.md, "Tags"). Every message a group sends is
// one of three kinds, told apart by the top two bits:
//
//    63  62  61       48 47             32 31           16 15            0
//   +---+---+-----------+-----------------+---------------+---------------+
//   | 0 | 0 |    seq    | signature hash  |  source rank  |     slot      |  collective message
//   +---+---+-----------+-----------------+---------------+---------------+
//   | 0 | 1 |            zero             |  source rank  |     zero      |  notice (a disagreement)
//   +---+---+-----------------------------+---------------+---------------+
//   | 1 |        user tag (31 bits)       |  source rank  |     zero      |  point-to-point
//   +---+---------------------------------+---------------+---------------+
//
// seq: the collective's sequence number modulo 2^14. A rank cannot finish a collective before
// its ring neighbours have begun it, so no rank runs more than size/2 collectives ahead: 14 bits
// tell apart every collective in flight for groups of up to 16384 ranks.
// signature hash: of what the rank called, so a message of a rank that called something else
// never matches (no wrong tensor); the signature headers themselves go with hash 0.
// slot: tells apart the messages one pair of ranks exchanges within one collective.
#pragma once

#include <cstdint>

namespace cnccl::host::tags {

constexpr int kSlotBits = 16;
constexpr int kSourceBits = 16;
constexpr int kHashBits = 16;
constexpr int kSeqBits = 14;
constexpr int kUserTagBits = 31;

constexpr int kSourceShift = kSlotBits;
constexpr int kHashShift = kSourceShift + kSourceBits;
constexpr int kSeqShift = kHashShift + kHashBits;
constexpr int kUserTagShift = kHashShift;

constexpr uint64_t field(int bits) { return (uint64_t{1} << bits) - 1; }

constexpr uint64_t kP2pBit = uint64_t{1} << 63;
constexpr uint64_t kNoticeBit = uint64_t{1} << 62;
constexpr uint64_t kSourceMask = field(kSourceBits) << kSourceShift;
constexpr int kMaxRanks = 1 << kSeqBits;

// Slots: the two signature headers take the top ones; the algorithms' own stay below them. A
// ring allreduce's allgather phase starts at kSecondPhase: its reduce-scatter uses fewer slots
// (at most 16 segments x (size - 1) steps, reduce_scatter_ring.cpp).
constexpr uint32_t kHeaderToRight = 0xFFFF;
constexpr uint32_t kHeaderToLeft = 0xFFFE;
constexpr uint32_t kSecondPhase = uint32_t{1} << (kSlotBits - 1);

constexpr uint64_t collective(uint64_t seq, uint16_t signature_hash, int source, uint32_t slot) {
  return ((seq & field(kSeqBits)) << kSeqShift) | (uint64_t(signature_hash) << kHashShift) |
         ((uint64_t(source) & field(kSourceBits)) << kSourceShift) | (slot & field(kSlotBits));
}

constexpr uint64_t notice(int source) { return kNoticeBit | (uint64_t(source) << kSourceShift); }

constexpr uint64_t p2p(int source, int user_tag) {
  return kP2pBit | ((uint64_t(uint32_t(user_tag)) & field(kUserTagBits)) << kUserTagShift) |
         ((uint64_t(source) & field(kSourceBits)) << kSourceShift);
}

// A receive from any source matches every tag bit but the source's.
constexpr uint64_t kAnySourceMask = ~kSourceMask;

constexpr int source_of(uint64_t tag) { return int((tag & kSourceMask) >> kSourceShift); }

}  // namespace cnccl::host::tags
