-- Child workflows (docs/composition.md, docs/design/composition.md): a run
-- starts runs of its own, waits for their outcomes and takes them down with it.
--
-- A child is a run like any other, placed by its own workflow key. Its
-- executions row names its parent; the parent's shard keeps a row per child
-- it started (`children`), written in the turn's commit that records the
-- start, which says what becomes of the child when the parent ends first
-- (`policy`) and whether its outcome has come back (`ended`).
--
-- The messages between the two are signals of reserved names (no client can
-- send one: core/rules.py), delivered by deliver_signals as any other, in the
-- sender's commit when the receiver's bucket is writable there and through
-- the outbox otherwise (shardq.deliver_control says what each one does):
--   shardq:run:start   to the child's shard: create the child run
--   shardq:run:child   to the parent: the child's outcome, buffered until the
--                      parent's wait takes it (key child:<child id>: once)
--   shardq:run:cancel  to a child: its parent ended, cancel it
ALTER TABLE shardq.executions ADD COLUMN parent_id uuid;

CREATE TABLE shardq.children (
    parent_id     uuid NOT NULL,
    child_id      uuid NOT NULL,
    -- The parent's call position of the start (ctx.start_child).
    position      integer NOT NULL,
    workflow_name text NOT NULL,
    workflow_id   text NOT NULL,
    policy        text NOT NULL CHECK (policy IN ('cancel', 'abandon', 'wait')),
    -- The child's end state once its outcome reached the parent; NULL while it
    -- is live (or its outcome is on its way).
    ended         text,
    PRIMARY KEY (parent_id, child_id)
) WITH (fillfactor = 90);

-- A wait for children (ctx.wait_children): one row however many children, its
-- request counting the outcomes still needed (`need`), which each arriving
-- outcome takes down; the parent wakes when it reaches 0.
ALTER TABLE shardq.waits DROP CONSTRAINT waits_kind_check;
ALTER TABLE shardq.waits ADD CONSTRAINT waits_kind_check
    CHECK (kind IN ('timer', 'signal', 'condition', 'interrupt', 'children'));
