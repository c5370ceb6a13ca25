//! Constructors and chainable setters for the option structs.
//!
//! The option structs are `#[non_exhaustive]` so fields can be added without breaking callers;
//! outside this crate they are built from `Default` (or a `new` taking the required fields)
//! and then either assigned field by field or configured with these setters:
//! `WriteOptions::default().mode(0o600).user("root")`.

use std::time::Duration;

use super::*;

/// Setters for `Option<String>` fields: `name(value)` stores `Some(value.into())`.
macro_rules! string_setters {
    ($($(#[$doc:meta])* $field:ident;)*) => {$(
        $(#[$doc])*
        pub fn $field(mut self, value: impl Into<String>) -> Self {
            self.$field = Some(value.into());
            self
        }
    )*};
}

/// Setters for plain fields: `name(value)` stores `value`.
macro_rules! value_setters {
    ($($(#[$doc:meta])* $field:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        pub fn $field(mut self, value: $ty) -> Self {
            self.$field = value;
            self
        }
    )*};
}

/// Setters for `Option<T>` fields of `Copy` values: `name(value)` stores `Some(value)`.
macro_rules! option_setters {
    ($($(#[$doc:meta])* $field:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        pub fn $field(mut self, value: $ty) -> Self {
            self.$field = Some(value);
            self
        }
    )*};
}

impl CreateOptions {
    string_setters! {
        /// Set [`CreateOptions::name`].
        name;
        /// Set [`CreateOptions::template`].
        template;
        /// Set [`CreateOptions::user`].
        user;
        /// Set [`CreateOptions::home`].
        home;
        /// Set [`CreateOptions::hostname`].
        hostname;
        /// Set [`CreateOptions::snapshot`].
        snapshot;
    }
    option_setters! {
        /// Set [`CreateOptions::timeout`].
        timeout: Duration;
    }
    value_setters! {
        /// Set [`CreateOptions::resources`].
        resources: Resources;
        /// Set [`CreateOptions::network`].
        network: NetworkPolicy;
        /// Set [`CreateOptions::on_timeout`].
        on_timeout: TimeoutAction;
        /// Set [`CreateOptions::auto_resume`].
        auto_resume: bool;
    }

    /// Add a sandbox-wide environment variable ([`CreateOptions::envs`]).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.insert(key.into(), value.into());
        self
    }

    /// Add a label ([`CreateOptions::labels`]).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Add an annotation ([`CreateOptions::annotations`]).
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Add a volume mount ([`CreateOptions::volumes`]).
    pub fn volume(mut self, mount: VolumeMount) -> Self {
        self.volumes.push(mount);
        self
    }
}

impl VolumeMount {
    /// Mount the whole of `volume` read-write at the absolute sandbox path `path`.
    pub fn new(volume: impl Into<String>, path: impl Into<String>) -> Self {
        VolumeMount {
            volume: volume.into(),
            path: path.into(),
            subpath: None,
            read_only: false,
        }
    }

    string_setters! {
        /// Set [`VolumeMount::subpath`].
        subpath;
    }
    value_setters! {
        /// Set [`VolumeMount::read_only`].
        read_only: bool;
    }
}

impl PreviewOptions {
    /// A private preview of `port` with the default token header and query parameter.
    pub fn new(port: u16) -> Self {
        PreviewOptions {
            port,
            ..Default::default()
        }
    }

    value_setters! {
        /// Set [`PreviewOptions::public`].
        public: bool;
    }
    option_setters! {
        /// Set [`PreviewOptions::token_ttl`].
        token_ttl: Duration;
    }

    /// Set [`PreviewOptions::token_header`].
    pub fn token_header(mut self, header: impl Into<String>) -> Self {
        self.token_header = header.into();
        self
    }

    /// Set [`PreviewOptions::token_query`].
    pub fn token_query(mut self, query: impl Into<String>) -> Self {
        self.token_query = query.into();
        self
    }

    /// Add one of [`PreviewOptions::request_headers`].
    pub fn request_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.request_headers.insert(name.into(), value.into());
        self
    }

    /// Add one of [`PreviewOptions::response_headers`].
    pub fn response_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.response_headers.insert(name.into(), value.into());
        self
    }
}

impl WatchOptions {
    value_setters! {
        /// Set [`WatchOptions::recursive`].
        recursive: bool;
        /// Set [`WatchOptions::report_ownership`].
        report_ownership: bool;
    }
    string_setters! {
        /// Set [`WatchOptions::user`].
        user;
    }
}

impl Resources {
    option_setters! {
        /// Set [`Resources::cpu`].
        cpu: f64;
        /// Set [`Resources::memory_mib`].
        memory_mib: u64;
        /// Set [`Resources::disk_mib`].
        disk_mib: u64;
        /// Set [`Resources::max_processes`].
        max_processes: u64;
        /// Set [`Resources::max_open_files`].
        max_open_files: u64;
    }
}

impl AnnotationUpdate {
    /// Also set `key` to `value` ([`AnnotationUpdate::set`]).
    pub fn and_set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.set.insert(key.into(), value.into());
        self
    }

    /// Also remove `key` ([`AnnotationUpdate::remove`]).
    pub fn and_remove(mut self, key: impl Into<String>) -> Self {
        self.remove.push(key.into());
        self
    }
}

impl ListOptions {
    string_setters! {
        /// Set [`ListOptions::name`].
        name;
    }

    /// Also require this label ([`ListOptions::labels`]).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Also accept this state ([`ListOptions::states`]).
    pub fn state(mut self, state: SandboxState) -> Self {
        self.states.push(state);
        self
    }
}

impl ProcessSpec {
    option_setters! {
        /// Set [`ProcessSpec::pty`].
        pty: PtySize;
        /// Set [`ProcessSpec::restart`].
        restart: RestartPolicy;
    }

    /// Add every pair to [`ProcessSpec::envs`].
    pub fn envs<K, V>(mut self, envs: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.envs
            .extend(envs.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }
}

impl RestartPolicy {
    /// Restart on every failure, without limit.
    pub fn unlimited() -> Self {
        RestartPolicy { max_restarts: None }
    }

    /// Restart on failure at most `max_restarts` times.
    pub fn at_most(max_restarts: u32) -> Self {
        RestartPolicy {
            max_restarts: Some(max_restarts),
        }
    }
}

impl ListDirOptions {
    value_setters! {
        /// Set [`ListDirOptions::depth`].
        depth: u32;
    }
    string_setters! {
        /// Set [`ListDirOptions::user`].
        user;
    }
    value_setters! {
        /// Set [`ListDirOptions::attributes`].
        attributes: bool;
    }
}

impl ReadOptions {
    string_setters! {
        /// Set [`ReadOptions::user`].
        user;
    }
    option_setters! {
        /// Set [`ReadOptions::max_bytes`].
        max_bytes: u64;
    }
}

impl StatOptions {
    string_setters! {
        /// Set [`StatOptions::user`].
        user;
    }
    value_setters! {
        /// Set [`StatOptions::attributes`].
        attributes: bool;
    }
}

impl WriteOptions {
    value_setters! {
        /// Set [`WriteOptions::create_parents`].
        create_parents: bool;
        /// Set [`WriteOptions::append`].
        append: bool;
    }
    option_setters! {
        /// Set [`WriteOptions::mode`].
        mode: u32;
        /// Set [`WriteOptions::max_bytes`].
        max_bytes: u64;
    }
    string_setters! {
        /// Set [`WriteOptions::user`].
        user;
    }
    value_setters! {
        /// Set [`WriteOptions::overwrite`].
        overwrite: bool;
    }

    /// Add one of [`WriteOptions::attributes`]: `attribute("user.origin", "upload")`.
    pub fn attribute(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }
}

impl RenameOptions {
    value_setters! {
        /// Set [`RenameOptions::overwrite`].
        overwrite: bool;
    }
    string_setters! {
        /// Set [`RenameOptions::user`].
        user;
    }
}

impl CopyOptions {
    value_setters! {
        /// Set [`CopyOptions::recursive`].
        recursive: bool;
        /// Set [`CopyOptions::overwrite`].
        overwrite: bool;
    }
    string_setters! {
        /// Set [`CopyOptions::user`].
        user;
    }
}

impl MkdirOptions {
    value_setters! {
        /// Set [`MkdirOptions::parents`].
        parents: bool;
    }
    option_setters! {
        /// Set [`MkdirOptions::mode`].
        mode: u32;
    }
    string_setters! {
        /// Set [`MkdirOptions::user`].
        user;
    }
}

impl RemoveOptions {
    value_setters! {
        /// Set [`RemoveOptions::recursive`].
        recursive: bool;
    }
    string_setters! {
        /// Set [`RemoveOptions::user`].
        user;
    }
}

impl SetTimeoutOptions {
    /// End the lease `timeout` from now.
    pub fn new(timeout: Duration) -> Self {
        SetTimeoutOptions { timeout }
    }
}

impl SetOnTimeoutOptions {
    /// End the lease with `on_timeout`.
    pub fn new(on_timeout: TimeoutAction) -> Self {
        SetOnTimeoutOptions { on_timeout }
    }
}

impl SetLabelsOptions {
    /// Replace the labels with `labels`.
    pub fn new(labels: BTreeMap<String, String>) -> Self {
        SetLabelsOptions { labels }
    }

    /// Also set this label ([`SetLabelsOptions::labels`]).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

impl WriteStdinOptions {
    /// Write `data`.
    pub fn new(data: impl Into<Vec<u8>>) -> Self {
        WriteStdinOptions { data: data.into() }
    }
}

impl SignalOptions {
    /// Send `signal`.
    pub fn new(signal: Signal) -> Self {
        SignalOptions { signal }
    }
}

impl ResizePtyOptions {
    /// Resize the terminal to `size`.
    pub fn new(size: PtySize) -> Self {
        ResizePtyOptions { size }
    }
}

impl ChmodOptions {
    /// Set the permission bits to `mode`.
    pub fn new(mode: u32) -> Self {
        ChmodOptions { mode }
    }
}

impl PreviewTokenOptions {
    option_setters! {
        /// Set [`PreviewTokenOptions::expires_at`].
        expires_at: UnixMillis;
    }
}

impl SnapshotOptions {
    string_setters! {
        /// Set [`SnapshotOptions::name`].
        name;
    }
    value_setters! {
        /// Set [`SnapshotOptions::memory`].
        memory: bool;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setters_store_what_they_are_given() {
        let create = CreateOptions::default()
            .name("n")
            .timeout(Duration::from_secs(5))
            .env("A", "1")
            .label("k", "v")
            .volume(VolumeMount::new("vol", "/data").read_only(true));
        assert_eq!(create.name.as_deref(), Some("n"));
        assert_eq!(create.timeout, Some(Duration::from_secs(5)));
        assert_eq!(create.envs.get("A").map(String::as_str), Some("1"));
        assert_eq!(create.labels.get("k").map(String::as_str), Some("v"));
        assert!(create.volumes[0].read_only && create.volumes[0].subpath.is_none());
        let write = WriteOptions::default().mode(0o600).user("root");
        assert_eq!(
            (write.mode, write.user.as_deref()),
            (Some(0o600), Some("root"))
        );
        assert!(write.create_parents, "defaults are kept");
        let write = WriteOptions::default().attribute("user.k", "v");
        assert_eq!(
            write.attributes.get("user.k").map(Vec::as_slice),
            Some(&b"v"[..])
        );
        assert!(StatOptions::default().attributes(true).attributes);
        assert!(ListDirOptions::default().attributes(true).attributes);
        assert_eq!(ListDirOptions::default().depth(3).depth, 3);
        let remove = RemoveOptions::default().recursive(true).user("u");
        assert!(remove.recursive && remove.user.as_deref() == Some("u"));
        assert_eq!(WatchOptions::default().user("u").user.as_deref(), Some("u"));
        assert_eq!(PreviewOptions::new(80).port, 80);
        assert_eq!(RestartPolicy::at_most(2).max_restarts, Some(2));
        assert_eq!(
            SnapshotOptions::default().name("s").name.as_deref(),
            Some("s")
        );
        assert_eq!(
            PreviewTokenOptions::default().expires_at(7).expires_at,
            Some(7)
        );
        let labels = SetLabelsOptions::default().label("k", "v").labels;
        assert_eq!(labels.get("k").map(String::as_str), Some("v"));
        assert_eq!(WriteStdinOptions::new("hi").data, b"hi");
    }
}
