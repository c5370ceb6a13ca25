//! A test backend that passes every call on to another one, changing only what a test's
//! [`Adapt`] says (the capabilities it reports, the file writes): the wrapper shared by the
//! test programs that put the engine behind a mask or a slow path. Built on [`Layer`], so
//! every call it does not change reaches the inner backend as made.
//!
//! The test modules using it name it `passthrough`.

use std::sync::Arc;

use async_trait::async_trait;
use sandcove::{Backend, ByteStream, Capabilities, FileStat, Layer, Result, WriteOptions};

/// What a [`Passthrough`] changes; each default passes the call on unchanged.
#[async_trait]
pub trait Adapt: std::fmt::Debug + Send + Sync + 'static {
    /// The capabilities reported (by `capabilities` and `ready`), from the inner backend's.
    fn capabilities(&self, inner: Capabilities) -> Capabilities {
        inner
    }

    /// A file write, given the inner backend.
    async fn write_file(
        &self,
        inner: &Arc<dyn Backend>,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        inner.write_file(id, path, data, options).await
    }
}

/// `inner` with the changes of `adapt`; every other call reaches `inner` as made.
#[derive(Debug)]
pub struct Passthrough<A> {
    /// The backend every call reaches.
    pub inner: Arc<dyn Backend>,
    /// What this wrapper changes.
    pub adapt: A,
}

#[async_trait]
impl<A: Adapt> Layer for Passthrough<A> {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    fn capabilities(&self) -> Capabilities {
        self.adapt.capabilities(self.inner.capabilities())
    }

    async fn ready(&self) -> Result<Capabilities> {
        Ok(self.adapt.capabilities(self.inner.ready().await?))
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        self.adapt
            .write_file(&self.inner, id, path, data, options)
            .await
    }
}
