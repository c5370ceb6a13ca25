//! Every raw syscall the local engine makes, each `unsafe` block with its justification.
//!
//! Nothing outside this module calls `libc` functions that need `unsafe`. The calls are grouped
//! by theme in submodules and re-exported here, so callers name them `sys::foo`.

use std::ffi::CString;
use std::io;
use std::path::Path;

mod fds;
mod files;
mod launch;
mod namespaces;
mod network;
mod privileges;
mod process;
mod terminals;

pub(crate) use self::fds::*;
pub(crate) use self::files::*;
pub(crate) use self::launch::*;
pub(crate) use self::namespaces::*;
pub(crate) use self::network::*;
pub(crate) use self::privileges::*;
pub(crate) use self::process::*;
pub(crate) use self::terminals::*;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstr(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}
