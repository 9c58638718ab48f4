//! The integration tests of the middleware, one binary: each module was a test of its own;
//! `common` is what the after-charge tests share.

mod after_charges;
mod common;
mod layer;
mod usage;
