//! A sandbox claimed from a warm pool is indistinguishable from a cold one.

use super::*;

/// A sandbox `first` hands out (with the local engine: a warm-pool member it claims) matches
/// one `second` creates cold with the same options, in everything a caller sees: name, envs,
/// labels, user, lease, annotations, a `/tmp` and `/workspace` nothing wrote to, no process
/// run before, its hostname, users, groups, limits and files. The default user is another
/// than the member's (`alice`), so the claim changes the user database.
pub async fn claimed_sandbox_matches_a_cold_one(first: &dyn Backend, second: &dyn Backend) {
    claimed_matches_cold(first, second, Some("alice")).await
}

/// [`claimed_sandbox_matches_a_cold_one`] with the default user left unset: the member's own
/// users, which a claim keeps.
pub async fn claimed_sandbox_with_the_default_user_matches_a_cold_one(
    first: &dyn Backend,
    second: &dyn Backend,
) {
    claimed_matches_cold(first, second, None).await
}

/// [`claimed_sandbox_matches_a_cold_one`] in the shape the Daytona and E2B listeners create
/// by default: a user and a home of the vendor's (`daytona`, `/home/daytona`) and `network`
/// (their default is [`NetworkPolicy::Internet`] where the runtime has it). The claim makes
/// the home and leaves `/workspace` as a cold create does.
pub async fn claimed_sandbox_in_a_vendor_shape_matches_a_cold_one(
    first: &dyn Backend,
    second: &dyn Backend,
    network: NetworkPolicy,
) {
    let shape = |mut o: CreateOptions| {
        o.home = Some("/home/daytona".into());
        o.network = network.clone();
        o
    };
    let view = claimed_matches_cold_as(first, second, Some("daytona"), shape).await;
    assert!(view.contains("\n/home/daytona\n"), "{view}");
}

async fn claimed_matches_cold(first: &dyn Backend, second: &dyn Backend, user: Option<&str>) {
    claimed_matches_cold_as(first, second, user, |o| o).await;
}

/// The case with `user` as default user and `shape` applied to the options; what a process
/// of the claimed sandbox sees.
async fn claimed_matches_cold_as(
    first: &dyn Backend,
    second: &dyn Backend,
    user: Option<&str>,
    shape: impl Fn(CreateOptions) -> CreateOptions,
) -> String {
    let lease = Duration::from_secs(321);
    let marker = unique("claim");
    let options = |name: &str| {
        let mut o = test_options(&marker)
            .env("CLAIM_A", "1")
            .env("CLAIM_B", "two words")
            .annotation("claim", "yes")
            .timeout(lease);
        o.name = Some(name.to_string());
        o.user = user.map(str::to_string);
        shape(o)
    };
    let (warm_view, warm_info) = fresh_view(first, options(&unique("warm")), lease).await;
    let (cold_view, cold_info) = fresh_view(second, options(&unique("cold")), lease).await;
    assert_eq!(warm_info, cold_info, "what get() says");
    assert_eq!(warm_view, cold_view, "what a process sees");
    assert!(warm_view.contains("\nCLAIM_B=two words\n"), "{warm_view}");
    if let Some(user) = user {
        assert!(warm_view.starts_with(&format!("{user}\n")), "{warm_view}");
    }
    warm_view
}
