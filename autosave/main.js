// The fxcache action's end-of-job save: nothing to do until the post step (post.js).
console.log("fxcache: the cache will be saved at the end of the job");
