// Loaded with `node --import` before Portkey's build/start-server.js (bench/overhead.sh
// --peers). That script calls @hono/node-server's serve({port}) without a hostname, so
// Node would listen on every interface; this binds a listen(port) without a host to
// 127.0.0.1 instead, so the benchmark never exposes a gateway beyond loopback.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, host, ...rest) {
  if (typeof port === "number" && (host === undefined || host === null)) {
    return listen.call(this, port, "127.0.0.1", ...rest);
  }
  if (typeof port === "number" && typeof host === "function") {
    return listen.call(this, port, "127.0.0.1", host, ...rest);
  }
  return listen.call(this, port, host, ...rest);
};
