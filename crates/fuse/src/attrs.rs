//! Attributes: getattr, setattr (times, mode, owner, truncate) and statfs.

use crate::convert::errno;
use crate::fs::Fs;
use crate::guard::Settled;
use crate::trace::{ReplyAttr, ReplyStatfs};
use fuser::{FileHandle, INodeNo};
use std::sync::Arc;
use tessera_client::SetAttr;

impl Fs {
    pub(crate) fn getattr(
        self: &Arc<Self>,
        s: Settled,
        ino: INodeNo,
        fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        if let Some(dir) = self.changed_dir(ino.0) {
            return self.attr_reply(reply, Ok(dir), None);
        }
        self.serve(s, move |fs| async move {
            let since = fs.since();
            let r = match fh.and_then(|fh| fs.file(fh)) {
                // An open handle knows of writes not yet published.
                Some(h) => h.file.lock().await.metadata().await,
                None => fs.client.getattr(ino.0).await,
            };
            fs.attr_reply(reply, r, since);
        });
    }

    /// `attr` as the kernel asked for it; a new size goes through handle `fh` if given.
    pub(crate) fn setattr(
        self: &Arc<Self>,
        s: Settled,
        ino: INodeNo,
        fh: Option<FileHandle>,
        mut attr: SetAttr,
        reply: ReplyAttr,
    ) {
        let size = attr.size;
        self.serve(s, move |fs| async move {
            let r = async {
                if let (Some(size), Some(h)) = (size, fh.and_then(|fh| fs.file(fh))) {
                    // Through the handle, so its buffered writes land before the cut.
                    let mut f = h.file.lock().await;
                    let r = f.set_len(size).await;
                    fs.settle(&mut f);
                    r?;
                    attr.size = None;
                }
                if let Some(size) = size {
                    fs.truncated(ino.0, size);
                    fs.bytes_changed(ino.0, fh.unwrap_or(FileHandle(0)));
                }
                fs.client.setattr(ino.0, attr).await
            }
            .await;
            if let Ok(i) = &r {
                fs.changed(i);
            }
            fs.dir_changed(ino.0, None);
            fs.attr_reply(reply, r, None);
        });
    }

    pub(crate) fn statfs(self: &Arc<Self>, s: Settled, reply: ReplyStatfs) {
        self.serve(s, move |fs| async move {
            match fs.client.usage().await {
                Ok(u) => {
                    const FRSIZE: u64 = 4096;
                    let free = u.capacity.saturating_sub(u.used) / FRSIZE;
                    // Inodes are not preallocated: report what the free memory could hold.
                    let ffree = u.capacity.saturating_sub(u.used) / 512;
                    reply.statfs(
                        u.capacity / FRSIZE,
                        free,
                        free,
                        u.inodes + ffree,
                        ffree,
                        fs.client.stripe_size(),
                        255,
                        FRSIZE as u32,
                    );
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}
