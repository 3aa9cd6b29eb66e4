// The host path's reusable buffers, one per role, since one collective uses all three at once.
// Each is uninitialized and grows, never shrinks, so steady-state collectives neither allocate
// nor fault in fresh pages. Used by the group's executor thread only.
#pragma once

#include <cstddef>
#include <memory>

namespace cnccl::host {

class Scratch {
 public:
  // Where a collective's algorithm works: the (16-bit) wire copy of the tensor, or the received data.
  char* workspace(size_t bytes) { return workspace_.get(bytes); }
  // A packed copy of the inputs, for algorithms that read one buffer and write another (gather,
  // scatter, all_to_all).
  char* staging(size_t bytes) { return staging_.get(bytes); }
  // An algorithm's own temporaries (the parts it receives before reducing them).
  char* algorithm(size_t bytes) { return algorithm_.get(bytes); }

 private:
  class Buffer {
   public:
    char* get(size_t bytes) {
      if (bytes > size_) {
        data_.reset(new char[bytes]);
        size_ = bytes;
      }
      return data_.get();
    }

   private:
    std::unique_ptr<char[]> data_;
    size_t size_ = 0;
  };

  Buffer workspace_, staging_, algorithm_;
};

}  // namespace cnccl::host
