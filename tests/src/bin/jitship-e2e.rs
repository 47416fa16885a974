//! The `jitship` command line, built inside the tests crate so end-to-end tests can run it as real
//! OS processes (`jitship_tests::cli::jitship()`). One addition for concurrency tests:
//! `JITSHIP_E2E_START_AT=<unix millis>` makes the process wait until that instant before it runs,
//! so several processes reach the store at the same moment.

fn main() {
    if let Some(at) = std::env::var("JITSHIP_E2E_START_AT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        if at > now {
            std::thread::sleep(std::time::Duration::from_millis(at - now));
        }
    }
    jitship::cli::main_and_exit()
}
