// The main of every unit-test binary: GoogleTest's, plus libtorch's fatal-signal handler, so a
// test that crashes (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) prints the C++ stack of every
// thread before the process dies as it would have (the signal is raised again). A crash that
// happens once in many runs, as on a GPU machine, is then explained by its first log. MKL's vector
// math is warmed up first, as the titan binary does (titan/common/cpu.h says why).
#include "titan/common/cpu.h"

#include <c10/util/signal_handler.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
#if defined(C10_SUPPORTS_FATAL_SIGNAL_HANDLERS)
  c10::FatalSignalHandler::getInstance().setPrintStackTracesOnFatalSignal(true);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  titan::warm_up_vector_math();
  return RUN_ALL_TESTS();
}
