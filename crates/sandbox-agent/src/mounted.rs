//! The filesystem service and `/files`, mounted into the server's hooks
//! ([`crate::server::Services`]): the glue between the router, which has already resolved the
//! caller (token, user, Connect headers, a bounded request message), and the plain async
//! methods of [`crate::fs`] and handler functions of [`crate::files`].

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{Request, Response};
use sandbox_envd::{Code, ConnectError, Method, filesystem};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::connect::{self, Body, ResponseStream};
use crate::files;
use crate::fs::reserved::Reserved;
use crate::fs::{Caller, Filesystem, FsLimits};
use crate::server::{
    BoxFuture, CallContext, FilesContext, FilesService, FilesystemService, Services,
};

/// Every service this build of the agent has, configured from its start flags.
pub fn builtin(config: &Config) -> Services {
    let reserved = Reserved::new(config.reserved_paths.iter().cloned());
    Services {
        filesystem: Some(Arc::new(FilesystemRpc {
            fs: Filesystem::with_reserved(
                config.accounts.clone(),
                FsLimits::default(),
                reserved.clone(),
            ),
        })),
        files: Some(Arc::new(FileEndpoints { reserved })),
    }
}

/// `filesystem.Filesystem` over [`Filesystem`].
#[derive(Debug)]
struct FilesystemRpc {
    fs: Filesystem,
}

fn caller(call: &CallContext) -> Caller {
    Caller {
        user: call.user.clone(),
        default_workdir: call.config.default_workdir.clone(),
    }
}

fn decode<T: DeserializeOwned>(request: &[u8]) -> Result<T, ConnectError> {
    connect::decode(request)
}

fn encode<T: Serialize>(answer: &T) -> Result<Bytes, ConnectError> {
    serde_json::to_vec(answer)
        .map(Bytes::from)
        .map_err(|e| ConnectError::new(Code::Internal, format!("encoding the answer: {e}")))
}

impl FilesystemService for FilesystemRpc {
    fn unary(
        &self,
        call: CallContext,
        method: Method,
        request: Bytes,
    ) -> BoxFuture<'_, Result<Bytes, ConnectError>> {
        Box::pin(async move {
            let who = caller(&call);
            let fs = &self.fs;
            match method {
                filesystem::method::STAT => encode(&fs.stat(&who, decode(&request)?).await?),
                filesystem::method::MAKE_DIR => {
                    encode(&fs.make_dir(&who, decode(&request)?).await?)
                }
                filesystem::method::MOVE => encode(&fs.move_entry(&who, decode(&request)?).await?),
                filesystem::method::LIST_DIR => {
                    encode(&fs.list_dir(&who, decode(&request)?).await?)
                }
                filesystem::method::REMOVE => encode(&fs.remove(&who, decode(&request)?).await?),
                filesystem::method::CREATE_WATCHER => {
                    encode(&fs.create_watcher(&who, decode(&request)?).await?)
                }
                filesystem::method::GET_WATCHER_EVENTS => {
                    encode(&fs.get_watcher_events(decode(&request)?).await?)
                }
                filesystem::method::REMOVE_WATCHER => {
                    encode(&fs.remove_watcher(decode(&request)?).await?)
                }
                other => Err(ConnectError::new(
                    Code::Unimplemented,
                    format!("{} is not a unary method", other.path),
                )),
            }
        })
    }

    fn server_stream(
        &self,
        call: CallContext,
        method: Method,
        request: Bytes,
        mut out: ResponseStream,
    ) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if method != filesystem::method::WATCH_DIR {
                let e = ConnectError::new(
                    Code::Unimplemented,
                    format!("{} is not a server-streaming method", method.path),
                );
                return out.end(Err(e)).await;
            }
            let request = match decode(&request) {
                Ok(request) => request,
                Err(e) => return out.end(Err(e)).await,
            };
            let mut events = match self
                .fs
                .watch_dir(&caller(&call), request, call.keepalive)
                .await
            {
                Ok(events) => events,
                Err(e) => return out.end(Err(e)).await,
            };
            while let Some(event) = events.next().await {
                match event {
                    Ok(message) => {
                        // The client went away: dropping `events` stops the watcher.
                        if out.send(&message).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => return out.end(Err(e)).await,
                }
            }
            out.end(Ok(())).await;
        })
    }
}

/// `GET /files` and `POST /files` over [`files::get_files`] and [`files::post_files`], which
/// authorize themselves (a token or a signed URL).
#[derive(Debug)]
struct FileEndpoints {
    reserved: Reserved,
}

impl FilesService for FileEndpoints {
    fn handle(&self, ctx: FilesContext, request: Request<Body>) -> BoxFuture<'_, Response<Body>> {
        Box::pin(async move {
            let config = &ctx.config;
            let files_ctx = files::FilesContext {
                accounts: config.accounts.clone(),
                default_user: Some(config.default_user.clone()),
                default_workdir: config.default_workdir.clone(),
                access_token: ctx.access_token.as_deref().map(str::to_owned),
                limits: files::FilesLimits::default(),
                reserved: self.reserved.clone(),
            };
            let answer = if request.method() == hyper::Method::GET {
                files::get_files(request, &files_ctx).await
            } else {
                files::post_files(request, &files_ctx).await
            };
            answer.map(|body| body.map_err(connect::BoxError::from).boxed_unsync())
        })
    }
}
