fn main() {
    // First: `install --deadline` counts from the process's start.
    jitship::install::mark_process_start();
    jitship::cli::main_and_exit()
}
