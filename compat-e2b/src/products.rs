//! E2B's other products (`Volume`, `Template`, `Secret`, `sandbox.git`): present so ported
//! code compiles, refused with `NotSupported` (see MAPPING.md) before any effect.

use crate::call::Call;
use crate::gaps::refuse;

/// `e2b.Volume` / `AsyncVolume`: not supported.
#[derive(Debug, Clone)]
pub struct Volume {
    /// `volume_id`.
    pub volume_id: String,
    /// `name`.
    pub name: String,
}

impl Volume {
    /// `Volume.create(name, **opts)`: not supported.
    pub fn create(name: impl Into<String>) -> Call<Volume> {
        let _ = name.into();
        Call::new(async { Err(refuse("volume_api")) })
    }

    /// `Volume.connect(volume_id, **opts)`: not supported.
    pub fn connect(volume_id: impl Into<String>) -> Call<Volume> {
        let _ = volume_id.into();
        Call::new(async { Err(refuse("volume_api")) })
    }

    /// `Volume.list(**opts)`: not supported.
    pub fn list() -> Call<Vec<Volume>> {
        Call::new(async { Err(refuse("volume_api")) })
    }

    /// `Volume.destroy(volume_id, **opts)`: not supported.
    pub fn destroy(volume_id: impl Into<String>) -> Call<bool> {
        let _ = volume_id.into();
        Call::new(async { Err(refuse("volume_api")) })
    }
}

/// `e2b.Template` / `AsyncTemplate` (the template build DSL): not supported.
#[derive(Debug, Clone, Default)]
pub struct Template;

impl Template {
    /// `Template()`: a builder that cannot be built here.
    pub fn new() -> Self {
        Template
    }

    /// `Template.build(template, alias, **opts)`: not supported.
    pub fn build(_template: Template, alias: impl Into<String>) -> Call<()> {
        let _ = alias.into();
        Call::new(async { Err(refuse("template_build")) })
    }

    /// `Template.exists(name, **opts)`: not supported.
    pub fn exists(name: impl Into<String>) -> Call<bool> {
        let _ = name.into();
        Call::new(async { Err(refuse("template_build")) })
    }
}

/// `e2b.Secret` / `AsyncSecret`: not supported.
#[derive(Debug, Clone, Default)]
pub struct Secret;

impl Secret {
    /// `Secret.create(name, value, **opts)`: not supported.
    pub fn create(name: impl Into<String>, value: impl Into<String>) -> Call<Secret> {
        let _ = (name.into(), value.into());
        Call::new(async { Err(refuse("secrets")) })
    }

    /// `Secret.list(**opts)`: not supported.
    pub fn list() -> Call<Vec<Secret>> {
        Call::new(async { Err(refuse("secrets")) })
    }

    /// `Secret.delete(name, **opts)`: not supported.
    pub fn delete(name: impl Into<String>) -> Call<bool> {
        let _ = name.into();
        Call::new(async { Err(refuse("secrets")) })
    }
}

/// `sandbox.git`: not supported; run `git` with `commands.run`.
#[derive(Debug, Clone, Default)]
pub struct Git;

impl Git {
    /// `git.clone(url, path=None, ...)`: not supported.
    pub fn clone(&self, url: impl Into<String>) -> Call<()> {
        let _ = url.into();
        Call::new(async { Err(refuse("git")) })
    }

    /// `git.status(path)`: not supported.
    pub fn status(&self, path: impl Into<String>) -> Call<String> {
        let _ = path.into();
        Call::new(async { Err(refuse("git")) })
    }

    /// `git.commit(path, message)`: not supported.
    pub fn commit(&self, path: impl Into<String>, message: impl Into<String>) -> Call<()> {
        let _ = (path.into(), message.into());
        Call::new(async { Err(refuse("git")) })
    }
}
