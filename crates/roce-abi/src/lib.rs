//! The C declarations rocev2's two C libraries share, each written once:
//!
//! * [`verbs`]: the libibverbs structures (`<infiniband/verbs.h>`, `docs/spec/LIBIBVERBS-ABI.md` §4) that
//!   roce-ibverbs (`libibverbs.so.1`) hands to programs and that roce-rdmacm (`librdmacm.so.1`) builds and reads
//!   when it calls libibverbs; every size and offset asserted at compile time.
//! * [`bridge`]: the private, versioned table `rocev2_private_v1@@ROCEV2_PRIVATE` through which librdmacm reaches
//!   the connection manager of libibverbs' runtime, with its versioning rule (any change of a field's layout or
//!   meaning bumps [`bridge::PRIVATE_VERSION`]; the exporter stamps it, the importer refuses another with
//!   [`bridge::check`]).
//!
//! Declarations only: `#[repr(C)]` structures, constants and function-pointer types, no code that calls C.

#![forbid(unsafe_code)]

pub mod bridge;
pub mod verbs;
