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

// False once closed; otherwise the caller may release Python-owned objects until leave(). Nests.
bool enter();
void leave();
// Waits for drops in progress, then closes for good. Call without the GIL. The wait is bounded
// (5 s): a drop that outlasts it (one that destroys a gloo group with a collective in flight) is
// not waited for, and may still abort the exit.
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

// Runs a completion (it marks a future completed, which runs and destroys the future's callbacks,
// Python ones among them), then `between` (a test's pause), then drops it. Inside the gate while
// it is open, so that close() waits for completions already running.
template <class F, class Between>
void run_then_drop(F& completion, Between between) {
  if (enter()) {
    completion();
    between();
    { F gone = std::exchange(completion, F{}); }
    leave();
  } else {
    completion();
    new F(std::exchange(completion, F{}));
  }
}

template <class F>
void run_then_drop(F& completion) {
  run_then_drop(completion, [] {});
}

}  // namespace cnccl::release_gate
