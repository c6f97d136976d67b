//! The allocator of every soldonce program: mimalloc instead of glibc's
//! malloc. The services allocate per message and per request (JSON trees,
//! strings, buffers) on several runtime threads; under load glibc's
//! `malloc`/`free` took about a tenth of their CPU samples
//! (`PERF=1 CLOSED=1 scripts/bench/statements.sh hot`). Declared once here,
//! so every program that links `platform` (each service, psp-sim and the
//! CLI) uses it.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
