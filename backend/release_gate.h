// Where cnccl's own threads drop what may hold a caller's tensors (docs/design.md, "Threads", on exit).
//
// A tensor that passed through Python keeps its PyObject, and dropping the tensor's last reference
// takes the GIL. Once the interpreter finalizes (a job that exits without destroy_process_group while
// a cnccl thread still holds a finished work or a job's closure), a thread that is not Python's own
// and asks for the GIL is ended by pthread_exit, and its unwinding through a destructor calls
// std::terminate ("terminate called without an active exception"). The Python extension closes this
// gate from an atexit handler, which runs before finalization: drops in progress finish first, later
// ones are leaked, the process being on its way out. Programs without Python never close it.
#pragma once

#include <utility>

namespace cnccl::release_gate {

// False once closed; otherwise the caller may release Python-owned objects until leave().
bool enter();
void leave();
// Waits (bounded) for drops in progress, then closes for good. Call without the GIL.
void close();

// Releases what `value` holds, leaving it empty, or leaks it once the gate is closed.
template <class T>
void drop(T& value) {
  if (enter()) {
    { T gone = std::exchange(value, T{}); }
    leave();
  } else {
    new T(std::exchange(value, T{}));  // never freed: the interpreter is finalizing
  }
}

}  // namespace cnccl::release_gate
