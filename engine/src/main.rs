fn main() {
    jitship::cli::main_and_exit()
}
