//! jitship: publishes JIT and kernel caches of LLM inference workers as immutable, verified
//! generations to a store, and installs the matching generation when the next worker starts.
//! See ARCHITECTURE.md for the codemap and the invariants.

pub mod audit;
pub mod cli;
pub mod config;
pub mod engines;
pub mod gc;
pub mod inspect;
pub mod install;
pub mod interrupt;
pub mod owner;
pub mod policies;
pub mod publish;
pub mod ready;
pub mod roots;
pub mod scrub;
pub mod server;
pub mod watch;

pub use jitship_author as author;
pub use jitship_catalog as catalog;
pub use jitship_confined as confined;
pub use jitship_facts as facts;
pub use jitship_generation as generation;
pub use jitship_oci as oci;
pub use jitship_policy as policy;
pub use jitship_scan as scan;
pub use jitship_store as store;
pub use jitship_trust as trust;
