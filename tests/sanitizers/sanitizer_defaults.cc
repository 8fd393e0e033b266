// Default sanitizer options, linked into every executable of a KVFERRY_SANITIZE build (the CLI,
// every unit test, every integration test), so a binary behaves the same however it is started:
// by ctest, by hand, or as a child process of `kvferry replay`. Settings in ASAN_OPTIONS,
// LSAN_OPTIONS and UBSAN_OPTIONS are applied on top of these (per key).
//
// Every report is fatal and ends the process with exit code 66 (not a signal, so the replay
// orchestrator reports "<rank> exited with code 66 after the shutdown" and fails the replay).
// LeakSanitizer runs at exit; leaks of third-party libraries we cannot fix are suppressed in
// lsan.supp (docs/testing.md explains each entry). KVFERRY_SANITIZER_DIR is this directory.
#ifndef KVFERRY_SANITIZER_DIR
#error "KVFERRY_SANITIZER_DIR must name tests/sanitizers"
#endif

#define KVFERRY_SANITIZER_HOOK extern "C" __attribute__((visibility("default"), used))

KVFERRY_SANITIZER_HOOK const char* __asan_default_options() {
  return "detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=66:"
         "check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1";
}

KVFERRY_SANITIZER_HOOK const char* __lsan_default_options() {
  return "suppressions=" KVFERRY_SANITIZER_DIR "/lsan.supp:print_suppressions=1:exitcode=66";
}

KVFERRY_SANITIZER_HOOK const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1:exitcode=66:"
         "suppressions=" KVFERRY_SANITIZER_DIR "/ubsan.supp";
}
