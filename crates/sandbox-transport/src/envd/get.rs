//! A bounded JSON `GET` on envd's server, for endpoints beside the protocol's own (the
//! sandbox agent's `/sandbox-agent/version`): the same connection, headers, deadline and
//! error mapping as every other call, and an answer read up to a limit the caller names.

use bytes::Bytes;
use hyper_util::client::legacy::connect::Connect;
use sandbox_core::{Error, Operation};
use sandbox_envd::CONTENT_TYPE_JSON;

use super::call::{CallOptions, Deadline, EnvdClient, full, ok_response, read_limited};
use crate::transported;

impl<C> EnvdClient<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// `GET path` (an absolute path, with its query if any), expecting a JSON answer of at
    /// most `limit` bytes, decoded as `T`. Bounded by the client's unary deadline unless
    /// `options` sets one.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        op: Operation,
        path: &str,
        limit: usize,
        options: CallOptions,
    ) -> Result<T, Error> {
        let deadline = Deadline::start(options.budget(self.inner.config.unary_timeout));
        let call = async {
            if !path.starts_with('/') {
                return Err(transported(Error::invalid_request(
                    op,
                    format!("{path:?} is not an absolute path"),
                )));
            }
            let request = self.request(op, hyper::Method::GET, path, full(Bytes::new()))?;
            let response = self.send(op, request).await?;
            let response = ok_response(op, response, CONTENT_TYPE_JSON, true).await?;
            let body = read_limited(op, response.into_body(), limit).await?;
            serde_json::from_slice(&body).map_err(|e| {
                transported(Error::internal(
                    op,
                    format!("{path} answered a malformed message: {e}"),
                ))
            })
        };
        deadline.bound(op, call).await.map_err(|e| self.tag(e))
    }
}
