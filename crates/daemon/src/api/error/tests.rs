use super::*;

fn one_of_each() -> Vec<ApiError> {
    let id = mesh_protocol::SecretKey::from_bytes(&[1; 32]).public();
    let kinds: Vec<ErrorKind> = vec![
        CallerError::BadJson("x".into()).into(),
        CallerError::BodyTooLarge {
            limit_bytes: 1,
            hint: "",
        }
        .into(),
        CallerError::CursorOtherNode("c".into()).into(),
        CallerError::Forbidden {
            uid: 1,
            daemon_uid: 2,
        }
        .into(),
        CallerError::MethodNotAllowed.into(),
        NotFound::UnknownPeer(id).into(),
        NotFound::NoRoute {
            method: "GET".into(),
            path: "/x".into(),
        }
        .into(),
        Capacity::OutboxFull("full".into()).into(),
        Capacity::Busy("busy".into()).into(),
        Capacity::TooManyPeers("many".into()).into(),
        Capacity::TooManyAgents("many".into()).into(),
        CallerError::UnverifiedSender("uid".into()).into(),
        CallerError::AmbiguousName("two".into()).into(),
        NotFound::UnknownAgent("carol".into()).into(),
        NotFound::UnknownMessage("00".into()).into(),
        Unavailable::Store("disk".into()).into(),
        Unavailable::Node("stopping".into()).into(),
        Bug::new("oops").into(),
    ];
    kinds.into_iter().map(ApiError::from).collect()
}

#[test]
fn each_fault_class_has_its_statuses() {
    for e in one_of_each() {
        let status = e.status().as_u16();
        let ok = match e.fault() {
            Fault::Caller => [400, 403, 405, 409].contains(&status),
            Fault::NotFound => status == 404,
            Fault::Capacity => [429, 409].contains(&status),
            Fault::Unavailable => status == 503,
            Fault::Bug => status == 500,
            _ => false,
        };
        assert!(ok, "{e}: {status} for {:?}", e.fault());
        // A client that only sees the status infers the same class,
        // except for the two 409s, which name their fault in the body.
        if status != 409 {
            assert_eq!(Fault::from_status(status), e.fault(), "{e}");
        }
    }
}

#[test]
fn a_note_and_a_place_are_kept_for_every_kind() {
    for e in one_of_each() {
        let (status, code) = e.status_and_code();
        let noted = e.clone().at("line 3".into()).with_note("2 of 5 committed");
        assert_eq!(noted.status_and_code(), (status, code));
        let text = noted.to_string();
        assert!(text.starts_with("line 3: "), "{text}");
        assert!(text.ends_with("; 2 of 5 committed"), "{text}");
        let body = noted.to_json(Some(serde_json::json!({ "committed": 2 })));
        assert_eq!(body["error"]["message"], text.as_str());
        assert_eq!(body["error"]["code"], code.as_str());
        assert_eq!(body["error"]["fault"], e.fault().as_str());
        assert_eq!(body["error"]["committed"], 2);
    }
}

#[test]
fn the_bus_and_the_store_errors_map_to_their_fault_classes() {
    let to = mesh_protocol::SecretKey::from_bytes(&[3; 32]).public();
    let send = |e| send_error(to, SendError::Refused(e)).fault();
    assert_eq!(send(CoreSendError::UnknownPeer(to)), Fault::NotFound);
    assert_eq!(send(CoreSendError::Busy { waiting: 9 }), Fault::Capacity);
    let full = CoreSendError::OutboxFull {
        peer: to,
        msgs: 1,
        bytes: 2,
    };
    assert_eq!(send(full), Fault::Capacity);
    assert_eq!(
        send(CoreSendError::Store("disk".into())),
        Fault::Unavailable
    );
    assert_eq!(send(CoreSendError::ToSelf), Fault::Caller);
    assert_eq!(send(CoreSendError::Internal("x".into())), Fault::Bug);
    assert_eq!(
        send_error(to, SendError::Stopped).fault(),
        Fault::Unavailable
    );

    let node = |e| node_error(e).status().as_u16();
    let waiting = PeerChangeError::Busy { waiting: 64 };
    assert_eq!(node(NodeError::PeerChange(waiting)), 429);
    assert_eq!(node(NodeError::PeerChange(PeerChangeError::SelfPeer)), 400);
    assert_eq!(
        node(NodeError::Store(StoreError::Conflict("x".into()))),
        500
    );
    assert_eq!(
        node(NodeError::Store(StoreError::Unavailable("disk".into()))),
        503
    );
    assert_eq!(node(NodeError::Peer(PeerError::ShutDown)), 503);
    assert_eq!(node(NodeError::Peer(PeerError::TooManyPeers)), 409);
    assert_eq!(node(NodeError::Peer(PeerError::SelfPeer)), 400);
    assert_eq!(node(NodeError::Peer(PeerError::UnknownPeer(to))), 404);
    assert_eq!(node(NodeError::Stopped), 503);
    assert_eq!(
        ApiError::from(StoreError::Closed).fault(),
        Fault::Unavailable
    );
}
