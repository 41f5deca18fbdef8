//! The declared capability set, pinned without a control plane: what the conformance run
//! registers its cases from, checked in the hermetic stage too, so a capability cannot appear
//! or vanish unnoticed.

use sandbox_core::{Capability, SandboxProvider};

use crate::recorder::Recorder;
use crate::wire::provider;

/// Everything but these five, each left out for a reason `e2b_capabilities` states: the
/// desktop until a desktop image exists for this adapter, and four E2B serves in ways of its
/// own (volumes, tunnels, template builds, a default user).
const LEFT_OUT: [Capability; 5] = [
    Capability::Desktop,
    Capability::Volumes,
    Capability::Tunnels,
    Capability::TemplateBuilds,
    Capability::DefaultUser,
];

#[tokio::test]
async fn the_declared_set_is_everything_but_the_desktop_and_four_of_e2bs_own() {
    let rec = Recorder::start().await;
    let p = provider(&rec);
    let declared = p.capabilities();
    for c in Capability::ALL {
        assert_eq!(
            declared.has(c),
            !LEFT_OUT.contains(&c),
            "{}: declared {}",
            c.as_str(),
            declared.has(c)
        );
    }
    assert_eq!(declared, sandbox_provider_e2b::e2b_capabilities());
    // Declared means callable: every declared port is reachable through its accessor.
    assert!(p.as_processes().is_some());
    assert!(p.as_terminals().is_some());
    assert!(p.as_terminal_reattach().is_some());
    assert!(p.as_streamed_files().is_some());
    assert!(p.as_watch().is_some());
    assert!(p.as_snapshots().is_some());
    assert!(p.as_template_catalog().is_some());
    assert!(p.as_pause_resume().is_some());
    assert!(p.as_desktop().is_none(), "no desktop image exists yet");
}
