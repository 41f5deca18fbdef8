//! Against E2B's cloud, opt-in only: runs when both `SANDBOX_E2B_LIVE=1` and `E2B_API_KEY` are
//! set, which xtask never does (no test traffic leaves the machine). Otherwise it says it was
//! skipped and why, and checks nothing. `E2B_TEMPLATE` picks the template (`base` unless set).
//!
//! ```text
//! SANDBOX_E2B_LIVE=1 E2B_API_KEY=e2b_... cargo nextest run -p sandbox-provider-e2b live --no-capture
//! ```

use sandbox_core::{CreateRequest, ExecRequest, SandboxPath, SandboxProvider, Secret, TemplateId};
use sandbox_provider_e2b::{E2bConfig, E2bProvider};

/// Why the live run does not happen here, when it does not.
fn not_live() -> Option<&'static str> {
    if std::env::var("SANDBOX_E2B_LIVE").ok().as_deref() != Some("1") {
        return Some("SANDBOX_E2B_LIVE is not 1");
    }
    if std::env::var("E2B_API_KEY").map_or(true, |k| k.trim().is_empty()) {
        return Some("E2B_API_KEY is not set");
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_on_e2bs_cloud_runs_a_command_and_keeps_a_file() {
    if let Some(why) = not_live() {
        println!(
            "skipped: the live E2B test runs only with SANDBOX_E2B_LIVE=1 and E2B_API_KEY ({why})"
        );
        return;
    }
    let key = std::env::var("E2B_API_KEY").unwrap();
    let template = std::env::var("E2B_TEMPLATE").unwrap_or_else(|_| "base".to_owned());
    let config = E2bConfig::new(
        sandbox_provider_e2b::config::DEFAULT_API_URL,
        Secret::new(key),
        template.clone(),
    );
    let provider = E2bProvider::new(config).unwrap();
    provider.health().await.unwrap();
    let handle = provider
        .create(CreateRequest::new(TemplateId::new(template).unwrap()))
        .await
        .unwrap();
    let outcome = async {
        let out = provider
            .exec(&handle, ExecRequest::shell("echo live-$((6 * 7))"))
            .await?;
        assert_eq!(out.stdout_lossy().trim(), "live-42", "{out:?}");
        let path = SandboxPath::new("/tmp/sandbox-live.txt")?;
        provider.write_file(&handle, &path, b"kept").await?;
        assert_eq!(provider.read_file(&handle, &path).await?, b"kept");
        Ok::<(), sandbox_core::Error>(())
    }
    .await;
    // Deleted whatever happened: a live sandbox costs money.
    provider.delete(handle.id()).await.unwrap();
    outcome.unwrap();
    println!(
        "live E2B: sandbox {} ran, kept a file, and was deleted",
        handle.id()
    );
}
