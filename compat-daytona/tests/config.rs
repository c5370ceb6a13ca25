//! `DaytonaConfig` and the `DAYTONA_*` environment: accepted, resolved like the Python SDK,
//! and never needed (the runtime settings decide where sandboxes live).

use daytona::{Daytona, DaytonaConfig};

#[test]
fn config_is_filled_from_the_environment_and_credentials_are_optional() {
    // The only test in this binary that touches the environment.
    std::env::set_var("DAYTONA_API_KEY", "dtn_from_env");
    std::env::set_var("DAYTONA_TARGET", "us");
    std::env::set_var("DAYTONA_SERVER_URL", "https://old.example/api");
    let d = Daytona::new(None).unwrap();
    assert_eq!(d.config().api_key.as_deref(), Some("dtn_from_env"));
    assert_eq!(d.config().target.as_deref(), Some("us"));
    assert_eq!(
        d.config().api_url.as_deref(),
        Some("https://old.example/api"),
        "DAYTONA_SERVER_URL is the deprecated fallback of api_url"
    );
    let explicit = Daytona::new(DaytonaConfig {
        api_key: Some("YOUR_API_KEY".into()),
        target: Some("eu".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(explicit.config().api_key.as_deref(), Some("YOUR_API_KEY"));
    assert_eq!(
        explicit.config().target.as_deref(),
        Some("eu"),
        "config wins"
    );
    for k in ["DAYTONA_API_KEY", "DAYTONA_TARGET", "DAYTONA_SERVER_URL"] {
        std::env::remove_var(k);
    }
    let bare = Daytona::new(None).unwrap();
    assert_eq!(bare.config().api_key, None, "no credentials needed");
    assert_eq!(DaytonaConfig::from_env(), DaytonaConfig::default());
}
