//! The image store's tests, one binary: a real registry on loopback (`docker-registry`), a
//! registry stub that misbehaves, hostile layers, and imports.

mod hostile;
mod import;
mod registry;
mod stub;
mod support;
