fn main() {
    std::process::exit(jitship::cli::main());
}
