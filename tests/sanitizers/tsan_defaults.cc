// Default ThreadSanitizer options, linked into every unit test of a KVFERRY_TSAN build
// (`make test-tsan`, build-tsan/; docs/testing.md, "ThreadSanitizer"). TSAN_OPTIONS in the
// environment is applied on top of these (per key). A report does not stop the process
// (halt_on_error=0) so one run lists every race, but it still fails the test: TSan's exit code
// (66) replaces a passing test's 0. KVFERRY_SANITIZER_DIR is this directory.
#ifndef KVFERRY_SANITIZER_DIR
#error "KVFERRY_SANITIZER_DIR must name tests/sanitizers"
#endif

extern "C" __attribute__((visibility("default"), used)) const char* __tsan_default_options() {
  return "halt_on_error=0:exitcode=66:second_deadlock_stack=1:history_size=4:"
         "suppressions=" KVFERRY_SANITIZER_DIR "/tsan.supp";
}
