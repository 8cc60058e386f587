//! What the broker's refusal of a call says: its AMQP reply code.

/// The reply code of a channel or connection the broker closed (404, 403,
/// 406, ...); `None` for any other error.
pub fn amqp_reply_code(e: &lapin::Error) -> Option<u16> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => Some(amqp.get_id()),
        _ => None,
    }
}

/// 404 NOT_FOUND: the object does not exist.
pub fn is_not_found(e: &lapin::Error) -> bool {
    amqp_reply_code(e) == Some(404)
}

/// 403 ACCESS_REFUSED: the user lacks the permission.
pub fn is_access_refused(e: &lapin::Error) -> bool {
    amqp_reply_code(e) == Some(403)
}
