//! One subject shared by every request.

use http::request::Parts;

use super::extractor::{KeyExtractor, KeyRejection};
use crate::subject::Subject;

/// Keys every request as one subject, `global`: a limit on the service as a whole.
///
/// ```
/// use http::Request;
/// use redlimit::key::{Global, KeyExtractor};
///
/// let (parts, ()) = Request::get("/anything").body(()).unwrap().into_parts();
/// assert_eq!(Global.extract(&parts), Ok(redlimit::Subject::new("global")));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _parts: &Parts) -> Result<Subject, KeyRejection> {
        Ok(Subject::new("global"))
    }
}
